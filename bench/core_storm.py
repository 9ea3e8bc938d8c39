"""The decision core under a storm: 10,000 alerts over 2,048 nodes and 256 jobs, or more.

Builds a cluster (leaf switches of 128 nodes) running jobs of 8 nodes, and a
storm of alerts as Alertmanager would deliver them (payloads of 10), mixing every signal: GPU
faults on a few nodes, NCCL timeouts from the others' ranks, application errors, stragglers,
re-deliveries of each. Feeds it through the real engine on a simulated clock and prints
alerts/s, the time to decide every incident, and peak memory (traced in a second run: tracing
slows the run it measures). `--sizes` runs 10,000 alerts over 2,048 nodes, 40,000 over 8,192
and 100,000 over 16,384: the time should grow as the alerts do.

    .venv/bin/python -m bench.core_storm [--alerts 10000 --nodes 2048 | --sizes]
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from webhook.core.alerts import Alert, Payload, wrap
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.decisions import Decision
from webhook.core.engine import Engine
from webhook.core.policy import Policy

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def cluster(nodes: int, jobs: int) -> ClusterView:
    names = [f"gpu{i:04d}" for i in range(1, nodes + 1)]
    view = ClusterView(
        switches={f"leaf{i // 128 + 1}": tuple(names[i : i + 128]) for i in range(0, nodes, 128)}
    )
    switch_of = {n: s for s, members in view.switches.items() for n in members}
    for n in names:
        view.nodes[n] = Node(n, "train", "alloc", "", switch_of[n])
    per = nodes // jobs
    for j in range(jobs):
        view.jobs[1000 + j] = Job(
            id=1000 + j,
            nodes=tuple(names[j * per : (j + 1) * per]),
            partition="train",
            started=T0 - timedelta(hours=2),
        )
    return view


def storm(view: ClusterView, count: int, rng: random.Random) -> list[Alert]:
    alerts: list[Alert] = []
    jobs = list(view.jobs.values())
    while len(alerts) < count:
        job = rng.choice(jobs)
        at = T0 + timedelta(seconds=rng.uniform(0, 600))
        kind = rng.random()
        if kind < 0.4:  # a GPU fault, then the others' NCCL timeouts
            bad = rng.choice(job.nodes)
            alerts.append(
                Alert(
                    status="firing",
                    startsAt=at,
                    labels={
                        "alertname": "GpuXidNodeFault",
                        "signal": "gpu_hw",
                        "node": bad,
                        "gpu": str(rng.randrange(8)),
                        "xid": "79",
                        "slurm_job_id": str(job.id),
                    },
                )
            )
            for n in job.nodes:
                if n != bad:
                    alerts.append(
                        Alert(
                            status="firing",
                            startsAt=at + timedelta(seconds=20),
                            labels={
                                "alertname": "TrainingNcclTimeout",
                                "signal": "nccl_timeout",
                                "node": n,
                                "rank": "0",
                                "slurm_job_id": str(job.id),
                            },
                        )
                    )
        elif kind < 0.7:
            for n in job.nodes:
                alerts.append(
                    Alert(
                        status="firing",
                        startsAt=at,
                        labels={
                            "alertname": "TrainingCudaError",
                            "signal": "app_error",
                            "node": n,
                            "slurm_job_id": str(job.id),
                        },
                    )
                )
        else:
            alerts.append(
                Alert(
                    status="firing",
                    startsAt=at,
                    labels={
                        "alertname": "TrainingStraggler",
                        "signal": "straggler",
                        "node": rng.choice(job.nodes),
                        "slurm_job_id": str(job.id),
                    },
                )
            )
    alerts = alerts[:count]
    alerts.sort(key=lambda a: a.startsAt)
    return alerts


SIZES = ((10_000, 2048), (40_000, 8192), (100_000, 16384))  # alerts, nodes (8 per job)


@dataclass(frozen=True)
class Run:
    alerts: int
    deliveries: int
    nodes: int
    jobs: int
    total: float  # seconds to receive and decide everything
    cpu: float  # the process's CPU seconds for it (the machine may be shared)
    peak: int  # bytes, traced in a run of its own (tracing slows the run it measures)
    decisions: list[Decision]
    decided: int


def deliveries(args: argparse.Namespace, alerts: int, nodes: int, jobs: int) -> list[Payload]:
    rng = random.Random(7)
    view = cluster(nodes, jobs)
    storm_ = storm(view, alerts, rng)
    payloads = [wrap(storm_[i : i + 10]) for i in range(0, len(storm_), 10)]
    out = []
    for pl in payloads:
        out.append(pl)
        if rng.random() < args.redeliver:
            out.append(pl)  # an HA peer's copy
    return out


def feed(view: ClusterView, sent: list[Payload]) -> tuple[Engine, list[Decision], float, float]:
    engine = Engine(view=view, policy=Policy(breaker={"max_fraction": 1.0}))  # type: ignore[arg-type]
    t0, c0 = time.perf_counter(), time.process_time()
    decisions = []
    for i, pl in enumerate(sent):
        engine.receive(pl, pl.alerts[0].startsAt + timedelta(seconds=1))
        if i % 50 == 0:
            decisions += engine.tick(pl.alerts[0].startsAt)
    decisions += engine.tick(T0 + timedelta(hours=1))
    return engine, decisions, time.perf_counter() - t0, time.process_time() - c0


def run(args: argparse.Namespace, alerts: int, nodes: int, jobs: int) -> Run:
    sent = deliveries(args, alerts, nodes, jobs)
    gc.collect()
    engine, decisions, total, cpu = feed(cluster(nodes, jobs), sent)
    decided = sum(1 for i in engine.incidents.values() if i.decided)
    del engine
    gc.collect()
    tracemalloc.start()
    feed(cluster(nodes, jobs), sent)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return Run(alerts, len(sent), nodes, jobs, total, cpu, peak, decisions, decided)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--alerts", type=int, default=10_000)
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--jobs", type=int, help="jobs of equal size (default: one per 8 nodes)")
    p.add_argument("--sizes", action="store_true", help="10k/2,048, 40k/8,192, 100k/16,384")
    p.add_argument("--redeliver", type=float, default=0.2, help="share of payloads sent twice")
    args = p.parse_args()
    sizes = SIZES if args.sizes else ((args.alerts, args.nodes),)
    runs = [run(args, a, n, args.jobs or n // 8) for a, n in sizes]
    print(
        f"{'alerts':>8} {'nodes':>7} {'jobs':>6} {'deliveries':>10} {'seconds':>8} "
        f"{'cpu s':>6} {'alerts/s':>9} {'incidents':>9} {'peak MiB':>8}"
    )
    for r in runs:
        print(
            f"{r.alerts:>8,} {r.nodes:>7,} {r.jobs:>6,} {r.deliveries:>10,} {r.total:>8.3f} "
            f"{r.cpu:>6.2f} {r.alerts / r.total:>9,.0f} {r.decided:>9,} {r.peak / 2**20:>8.1f}"
        )
    if len(runs) > 1:
        first, last = runs[0], runs[-1]
        print(
            f"{last.alerts / first.alerts:.0f}x the alerts took "
            f"{last.total / first.total:.1f}x the time, {last.cpu / first.cpu:.1f}x the CPU "
            "(linear: the same factor)"
        )
    else:
        (r,) = runs
        print(
            "decisions by action/cause: "
            + ", ".join(
                f"{a}/{c}={n}"
                for (a, c), n in sorted(Counter((d.action, d.cause) for d in r.decisions).items())
            )
        )


if __name__ == "__main__":
    main()
