"""30 days of alerts through ONE engine on a simulated clock: memory and time per decision must
stay flat from day 1 to day 30 (the engine forgets what is past the policy's retention).

A 2,048-node cluster (leaf switches of 128) keeps about nine tenths of its nodes busy with jobs
of 1 to 32 nodes that run from 6 hours to 3 days; a finished job leaves Slurm's view 10 minutes
after it ends, and another starts on its nodes. Each day brings (Poisson) GPU faults (an XID,
then the peers' NCCL timeouts, then the job fails), application crashes, stragglers, hangs and
faults of idle nodes; Alertmanager repeats every firing alert every 4 hours until it resolves,
and an HA peer sends a fifth of the payloads twice. What the engine decides is done, as Slurm
would: a drained node is repaired after 1 to 3 days, a requeued job restarts on a spare node
5 minutes later, a stopped one ends. The engine is ticked every 15 simulated seconds.

Per day: alerts delivered, decisions, incidents alive in the engine, RSS, the engine's traced
memory (in a second, identical run: tracing slows the run it measures), and the engine's time
per decision (the ticks that decided, per decision: mean and p99), and per alert received.

    .venv/bin/python -m bench.engine_stream [--days 30] [--nodes 2048] [--faults 12]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import random
import resource
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from webhook.core.alerts import Alert, Payload, wrap
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.decisions import Decision
from webhook.core.engine import Engine
from webhook.core.policy import Policy

T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
TICK = timedelta(seconds=15)
REPEAT = timedelta(hours=4)  # Alertmanager's repeat_interval
SIZES = (1, 2, 4, 8, 8, 8, 16, 32)


@dataclass
class Day:
    alerts: int = 0
    decisions: int = 0
    per_decision: list[float] = field(default_factory=list)  # seconds
    receive: float = 0.0  # seconds
    alive: int = 0
    rss: float = 0.0  # MiB
    traced: float = 0.0  # MiB


class Sim:
    """The cluster, Slurm's side of it and Alertmanager's deliveries, on a simulated clock."""

    def __init__(self, nodes: int, faults_per_day: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.faults = faults_per_day
        names = [f"gpu{i:04d}" for i in range(1, nodes + 1)]
        self.switches = {
            f"leaf{i // 128 + 1}": tuple(names[i : i + 128]) for i in range(0, nodes, 128)
        }
        switch_of = {n: s for s, members in self.switches.items() for n in members}
        self.nodes = {n: Node(n, "train", "idle", "", switch_of[n]) for n in names}
        self.jobs: dict[int, Job] = {}
        self.next_job = 100_000
        self.events: list[tuple[datetime, int, Callable[[datetime], None]]] = []
        self.seq = 0
        self.outbox: list[tuple[datetime, Payload]] = []
        self.view = self._view()
        self.changed = False
        for _ in range(len(names)):
            self._start_job(T0 - timedelta(hours=self.rng.uniform(0, 48)))
        for t in (T0 + DAY * d for d in range(200)):
            self.at(t, self._plan_day)

    # ---- the clock ----------------------------------------------------------------------
    def at(self, when: datetime, what: Callable[[datetime], None]) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, what))

    def run_until(self, until: datetime) -> None:
        while self.events and self.events[0][0] <= until:
            when, _, what = heapq.heappop(self.events)
            what(when)

    def _view(self) -> ClusterView:
        """Slurm's view as the adapter builds it: a new one whenever something changed."""
        view = ClusterView(nodes=dict(self.nodes), switches=self.switches)
        for j in self.jobs.values():
            view.set_job(j)
        return view

    def refresh(self) -> ClusterView | None:
        if not self.changed:
            return None
        self.changed = False
        self.view = self._view()
        return self.view

    # ---- jobs ---------------------------------------------------------------------------
    def _idle(self) -> list[str]:
        busy = {n for j in self.jobs.values() if j.state in ("RUNNING", "PENDING") for n in j.nodes}
        return [n for n, node in self.nodes.items() if node.state == "idle" and n not in busy]

    def _start_job(self, when: datetime) -> None:
        idle = self._idle()
        size = self.rng.choice(SIZES)
        # About a tenth of the cluster stays free (spares, and room for the next job).
        if len(idle) - size < len(self.nodes) // 10:
            return
        job = Job(
            id=self.next_job,
            nodes=tuple(sorted(self.rng.sample(idle, size))),
            partition="train",
            started=when,
        )
        self.next_job += 1
        self.jobs[job.id] = job
        self.changed = True
        self.at(
            when + timedelta(hours=self.rng.uniform(6, 72)),
            partial(self._end_now, job.id, 0),
        )

    def _forget(self, job_id: int, _t: datetime) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.state not in ("RUNNING", "PENDING"):
            del self.jobs[job_id]
            self.changed = True

    # ---- faults -------------------------------------------------------------------------
    def _plan_day(self, day: datetime) -> None:
        for kind, share in (("gpu", 1.0), ("app", 1.5), ("straggler", 0.5), ("hang", 0.3)):
            for _ in range(self._poisson(self.faults * share)):
                self.at(day + DAY * self.rng.random(), partial(self._fault, kind=kind))
        for _ in range(self._poisson(self.faults * 0.2)):
            self.at(day + DAY * self.rng.random(), self._idle_fault)

    def _poisson(self, mean: float) -> int:
        n, t = 0, self.rng.expovariate(1)
        while t < mean:
            n, t = n + 1, t + self.rng.expovariate(1)
        return n

    def _running(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state == "RUNNING" and len(j.nodes) > 1]

    def _fault(self, t: datetime, *, kind: str) -> None:
        jobs = self._running()
        if not jobs:
            return
        job = self.rng.choice(jobs)
        bad = self.rng.choice(job.nodes)
        jl = {"slurm_job_id": str(job.id)}
        if kind == "gpu":
            self.fire(
                t,
                {
                    "alertname": "GpuXidNodeFault",
                    "signal": "gpu_hw",
                    "node": bad,
                    "xid": "79",
                    **jl,
                },
                hours=self.rng.uniform(1, 12),
            )
            for n in job.nodes:
                if n != bad:
                    self.fire(
                        t + timedelta(seconds=40),
                        {
                            "alertname": "TrainingNcclTimeout",
                            "signal": "nccl_timeout",
                            "node": n,
                            **jl,
                        },
                        hours=0.5,
                    )
            self._fail(job.id, t + timedelta(seconds=70), "FAILED")
        elif kind == "app":
            for n in job.nodes:
                self.fire(
                    t,
                    {"alertname": "TrainingCudaError", "signal": "app_error", "node": n, **jl},
                    hours=0.5,
                )
            self._fail(job.id, t + timedelta(seconds=30), "FAILED")
        elif kind == "straggler":
            self.fire(
                t,
                {"alertname": "TrainingStraggler", "signal": "straggler", "node": bad, **jl},
                hours=2,
            )
        else:
            self.fire(t, {"alertname": "TrainingHang", "signal": "hang", **jl}, hours=1)
            for n in job.nodes:
                if n != bad:
                    self.fire(
                        t + timedelta(seconds=90),
                        {
                            "alertname": "TrainingNcclTimeout",
                            "signal": "nccl_timeout",
                            "node": n,
                            **jl,
                        },
                        hours=0.5,
                    )

    def _idle_fault(self, t: datetime) -> None:
        idle = self._idle()
        if idle:
            node = self.rng.choice(idle)
            self.fire(
                t,
                {"alertname": "SlurmNodeDown", "signal": "node_down", "node": node},
                hours=self.rng.uniform(1, 24),
            )

    def _fail(self, job_id: int, when: datetime, state: str) -> None:
        job = self.jobs[job_id]

        def fail(t: datetime) -> None:
            current = self.jobs.get(job_id)
            if current is None or current.restarts != job.restarts or current.state != "RUNNING":
                return
            self.jobs[job_id] = replace(current, state=state, ended=t)
            self.changed = True
            # Not requeued within an hour (stopped, or nothing decided): Slurm forgets it.
            self.at(t + timedelta(hours=1), partial(self._forget_failed, job_id, job.restarts))

        self.at(when, fail)

    def _forget_failed(self, job_id: int, restarts: int, _t: datetime) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.restarts == restarts and job.state not in ("RUNNING", "PENDING"):
            del self.jobs[job_id]
            self.changed = True
            self.at(job.ended or T0, self._start_job)

    def fire(self, t: datetime, labels: dict[str, str], hours: float) -> None:
        """An alert that fires at `t` and is delivered then and every REPEAT while it fires."""
        alert = Alert(status="firing", startsAt=t, labels=labels)
        sent = t + timedelta(seconds=self.rng.uniform(5, 30))  # group_wait
        end = t + timedelta(hours=hours)
        while sent < end:
            self.outbox.append((sent, wrap([alert])))
            if self.rng.random() < 0.2:
                self.outbox.append((sent, wrap([alert])))  # an HA peer's copy
            sent += REPEAT

    # ---- what the engine decided, done ---------------------------------------------------
    def carry_out(self, decisions: list[Decision], t: datetime) -> None:
        for d in decisions:
            if d.action == "drain":
                for n in d.nodes:
                    self.nodes[n] = replace(self.nodes[n], state="drain")
                    self.at(t + timedelta(days=self.rng.uniform(1, 3)), partial(self._repair, n))
                self.changed = True
            elif d.action == "requeue" and d.job in self.jobs:
                self._requeue(self.jobs[d.job], set(d.exclude) | set(d.nodes), t)
            elif d.action == "stop" and d.job in self.jobs:
                job = self.jobs[d.job]
                self.jobs[d.job] = replace(job, state="CANCELLED", ended=job.ended or t)
                self.changed = True
                self.at(t + timedelta(minutes=10), partial(self._forget, d.job))
                self.at(t + timedelta(minutes=1), self._start_job)

    def _repair(self, node: str, _t: datetime) -> None:
        self.nodes[node] = replace(self.nodes[node], state="idle")
        self.changed = True

    def _requeue(self, job: Job, exclude: set[str], t: datetime) -> None:
        keep = [n for n in job.nodes if n not in exclude and self.nodes[n].state == "idle"]
        spares = [n for n in self._idle() if n not in job.nodes]
        need = len(job.nodes) - len(keep)
        if len(spares) < need:
            return
        new = replace(
            job,
            state="PENDING",
            restarts=job.restarts + 1,
            started=None,
            ended=None,
            nodes=tuple(sorted(keep + self.rng.sample(spares, need))),
        )
        self.jobs[job.id] = new
        self.changed = True

        def start(t2: datetime) -> None:
            current = self.jobs.get(job.id)
            if current is not None and current.restarts == new.restarts:
                self.jobs[job.id] = replace(current, state="RUNNING", started=t2)
                self.changed = True
                self.at(
                    t2 + timedelta(hours=self.rng.uniform(6, 48)),
                    partial(self._end_now, job.id, new.restarts),
                )

        self.at(t + timedelta(minutes=5), start)

    def _end_now(self, job_id: int, restarts: int, t: datetime) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.restarts == restarts and job.state == "RUNNING":
            self.jobs[job_id] = replace(job, state="COMPLETED", ended=t)
            self.changed = True
            self.at(t + timedelta(minutes=10), partial(self._forget, job_id))
            self.at(t + timedelta(minutes=1), self._start_job)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def stream(args: argparse.Namespace, traced: bool) -> list[Day]:
    sim = Sim(args.nodes, args.faults, args.seed)
    engine = Engine(view=sim.view, policy=Policy())
    days = [Day() for _ in range(args.days)]
    if traced:
        tracemalloc.start()
    now = T0
    end = T0 + DAY * args.days
    while now < end:
        day = days[(now - T0) // DAY]
        sim.run_until(now)
        if (view := sim.refresh()) is not None:
            engine.update_view(view, now)
        sim.outbox.sort(key=lambda p: p[0])
        due = [p for p in sim.outbox if p[0] <= now]
        if due:
            sim.outbox = sim.outbox[len(due) :]
            t0 = time.perf_counter()
            for at, payload in due:
                engine.receive(payload, at)
            day.receive += time.perf_counter() - t0
            day.alerts += len(due)
        t0 = time.perf_counter()
        made = engine.tick(now)
        spent = time.perf_counter() - t0
        if made:
            incidents = len({d.incident for d in made})
            day.per_decision += [spent / incidents] * incidents
            day.decisions += len(made)
            sim.carry_out(made, now)
        now += TICK
        if (now - T0) % DAY == timedelta(0):
            day.alive = len(engine.incidents)
            day.rss = rss_mib()
            if traced:
                gc.collect()
                day.traced = tracemalloc.get_traced_memory()[0] / 2**20
    if traced:
        tracemalloc.stop()
    return days


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) >= 2 else (xs[0] if xs else 0.0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--faults", type=float, default=12, help="GPU faults per day (others scale)")
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args()
    days = stream(args, traced=False)
    traced = stream(args, traced=True)
    print(
        f"{'day':>3} {'alerts':>7} {'decisions':>9} {'alive':>6} {'RSS MiB':>8} "
        f"{'traced MiB':>10} {'µs/decision':>11} {'p99 µs':>8} {'µs/alert':>8}"
    )
    rows: list[dict[str, Any]] = []
    for i, (d, m) in enumerate(zip(days, traced, strict=True), start=1):
        row = {
            "day": i,
            "alive": d.alive,
            "rss": d.rss,
            "traced": m.traced,
            "mean": statistics.fmean(d.per_decision) * 1e6 if d.per_decision else 0.0,
            "p99": p99(d.per_decision) * 1e6,
            "alert": d.receive / d.alerts * 1e6 if d.alerts else 0.0,
        }
        rows.append(row)
        print(
            f"{i:>3} {d.alerts:>7,} {d.decisions:>9,} {d.alive:>6,} {d.rss:>8.1f} "
            f"{m.traced:>10.2f} {row['mean']:>11.0f} {row['p99']:>8.0f} {row['alert']:>8.1f}"
        )
    first, last = rows[0], rows[-1]
    print(
        f"day 1 vs day {last['day']}: incidents alive {first['alive']} vs {last['alive']}, "
        f"traced {first['traced']:.2f} vs {last['traced']:.2f} MiB, "
        f"RSS {first['rss']:.0f} vs {last['rss']:.0f} MiB, "
        f"per decision {first['mean']:.0f} vs {last['mean']:.0f} µs "
        f"(p99 {first['p99']:.0f} vs {last['p99']:.0f}), "
        f"per alert {first['alert']:.1f} vs {last['alert']:.1f} µs"
    )


if __name__ == "__main__":
    main()
