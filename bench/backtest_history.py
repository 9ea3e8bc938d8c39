"""A synthetic month of a cluster's history, for the backtest's bench: the alerts slurmedic's
rules would have fired (as Prometheus keeps them: `ALERTS` samples every evaluation), every
attempt of every job and every node event (as Slurm accounting keeps them), and what people
did: late drains with their reasons, resubmissions, requeues, maintenance no alert explains.

The cluster: `nodes` nodes in leaf switches of 128, cut into slots of 8 to 128 nodes; each slot
runs jobs back to back (6 to 48 hours each). Each day brings (Poisson) GPU faults, nodes lost,
application crashes and maintenance drains. Deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from webhook.backtest.history import Attempt, ClusterShape, NodeEvent

T0 = datetime(2026, 10, 1, tzinfo=UTC)
EVAL = timedelta(seconds=15)
SLOT_SIZES = (8, 16, 16, 32, 32, 64, 128)
REASONS_GPU = ("bad HBM", "XID 79 fell off the bus", "GPU to replace", "RMA opened")
REASONS_NODE = ("mainboard", "PSU replaced", "does not boot")
REASONS_MAINT = ("firmware update", "maintenance", "cable check")
USERS = ("alice", "bob", "carol", "dave", "erin")
NAMES = ("pretrain-70b", "pretrain-8b", "finetune", "eval-sweep", "rlhf")


@dataclass
class Alert:
    labels: dict[str, str]
    start: datetime
    end: datetime

    def samples(self) -> Iterator[datetime]:
        t = self.start
        while t < self.end:
            yield t
            t += EVAL


@dataclass
class History:
    start: datetime
    until: datetime
    shape: ClusterShape
    alerts: list[Alert] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    events: list[NodeEvent] = field(default_factory=list)
    # What the generator made people do, for the bench's check of the report.
    people: dict[str, int] = field(default_factory=dict)

    def openmetrics(self) -> Iterator[str]:
        """The alerts as OpenMetrics text for `promtool tsdb create-blocks-from openmetrics`:
        one `ALERTS` series per alert, its samples in time order (seconds)."""
        yield "# TYPE ALERTS gauge\n"
        by_series: dict[tuple[tuple[str, str], ...], list[Alert]] = {}
        for a in self.alerts:
            key = tuple(sorted({**a.labels, "alertstate": "firing"}.items()))
            by_series.setdefault(key, []).append(a)
        for key, alerts in by_series.items():
            labels = ",".join(f'{k}="{v}"' for k, v in key)
            for a in sorted(alerts, key=lambda a: a.start):
                for t in a.samples():
                    yield f"ALERTS{{{labels}}} 1 {t.timestamp():.0f}\n"
        yield "# EOF\n"


def node_name(i: int) -> str:
    return f"gpu{i + 1:04d}"


def generate(
    *, seed: int = 15, nodes: int = 2048, days: int = 30, gpu_faults: float = 12.0
) -> History:
    rng = random.Random(seed)
    start, until = T0, T0 + timedelta(days=days)
    names = [node_name(i) for i in range(nodes)]
    shape = ClusterShape(
        nodes={n: ("train", 8) for n in names},
        switches={
            f"leaf{k + 1:02d}": tuple(names[k * 128 : (k + 1) * 128])
            for k in range(-(-nodes // 128))
        },
    )
    h = History(start, until, shape, people={"drains": 0, "resubmits": 0, "requeues": 0})
    # Slots of nodes that run jobs back to back.
    slots: list[list[str]] = []
    i = 0
    while i < nodes:
        size = min(rng.choice(SLOT_SIZES), nodes - i)
        slots.append(names[i : i + size])
        i += size
    job_id = 1000
    # Faults, per day, by kind: (rate, kind).
    kinds = ((gpu_faults, "gpu"), (gpu_faults / 3, "node"), (gpu_faults, "app"), (2.0, "maint"))
    faults: list[tuple[datetime, str, int]] = []
    for day in range(days):
        for rate, kind in kinds:
            t = start + timedelta(days=day)
            while True:
                t += timedelta(seconds=rng.expovariate(rate / 86400))
                if t >= start + timedelta(days=day + 1):
                    break
                faults.append((t, kind, rng.randrange(len(slots))))
    faults.sort()
    by_slot: dict[int, list[tuple[datetime, str]]] = {}
    for t, kind, s in faults:
        by_slot.setdefault(s, []).append((t, kind))
    for s, slot in enumerate(slots):
        t = start - timedelta(hours=rng.uniform(0, 24))
        pending = sorted(by_slot.get(s, []))
        resubmit = False
        while t < until:
            job_id += 1
            if not resubmit:  # a resubmission is its user's same job, under a new id
                user, name = rng.choice(USERS), rng.choice(NAMES)
            length = timedelta(hours=rng.uniform(6, 48))
            t, resubmit = _run_job(rng, h, slot, job_id, user, name, t, length, pending)
    h.attempts.sort(key=lambda a: (a.started or a.submitted or start, a.job))
    h.events.sort(key=lambda e: (e.start, e.node))
    h.alerts.sort(key=lambda a: a.start)
    return h


def _run_job(
    rng: random.Random,
    h: History,
    slot: list[str],
    job: int,
    user: str,
    name: str,
    t: datetime,
    length: timedelta,
    pending: list[tuple[datetime, str]],
) -> tuple[datetime, bool]:
    """Run one job (and its requeued attempts) on the slot from `t`; the time the slot is free
    again, and whether its user resubmits it then."""
    attempt, submitted = 0, t - timedelta(minutes=rng.uniform(1, 30))
    while True:
        end = t + length
        fault = pending[0] if pending and pending[0][0] < end else None

        def run(until: datetime, state: str, code: int, n: int = attempt, at: datetime = t) -> None:
            h.attempts.append(
                Attempt(
                    job,
                    n,
                    name,
                    user,
                    "train",
                    tuple(slot),
                    submitted,
                    at,
                    until,
                    state,
                    code,
                    8 * len(slot),
                )
            )

        if fault is None:
            run(end, "COMPLETED", 0)
            return end + timedelta(minutes=rng.uniform(1, 20)), False
        pending.pop(0)
        at, kind = fault
        if at < t:
            continue
        node = rng.choice(slot)
        if kind == "maint":
            # A person drains a node for maintenance: no alert; the job goes on.
            back = at + timedelta(hours=rng.uniform(1, 8))
            h.events.append(NodeEvent(node, at, back, "DRAIN", rng.choice(REASONS_MAINT), "ops"))
            h.people["drains"] += 1
            continue
        ended = at + timedelta(seconds=rng.uniform(20, 90))
        state = {"gpu": "FAILED", "node": "NODE_FAIL", "app": "FAILED"}[kind]
        labels = {"slurm_job_id": str(job), "severity": "critical"}
        if kind == "gpu":
            h.alerts.append(
                Alert(
                    {
                        **labels,
                        "alertname": "GpuXidNodeFault",
                        "signal": "gpu_hw",
                        "node": node,
                        "gpu": str(rng.randrange(8)),
                        "xid": "79",
                    },
                    at,
                    at + timedelta(minutes=rng.uniform(10, 60)),
                )
            )
            if rng.random() < 0.8:
                drained = at + timedelta(minutes=rng.lognormvariate(3.5, 0.6))
                back = drained + timedelta(days=rng.uniform(1, 3))
                h.events.append(
                    NodeEvent(node, drained, back, "DRAIN", rng.choice(REASONS_GPU), "ops")
                )
                h.people["drains"] += 1
        elif kind == "node":
            h.alerts.append(
                Alert(
                    {
                        "alertname": "SlurmNodeDown",
                        "signal": "node_down",
                        "node": node,
                        "severity": "critical",
                    },
                    at + timedelta(seconds=30),
                    at + timedelta(hours=2),
                )
            )
            h.events.append(
                NodeEvent(node, at, at + timedelta(hours=2), "DOWN*", "Not responding", "root")
            )
            if rng.random() < 0.5:
                drained = at + timedelta(minutes=rng.uniform(30, 240))
                h.events.append(
                    NodeEvent(
                        node,
                        drained,
                        drained + timedelta(days=1),
                        "DRAIN",
                        rng.choice(REASONS_NODE),
                        "ops",
                    )
                )
                h.people["drains"] += 1
        else:  # an application crash on every rank
            for n in slot:
                h.alerts.append(
                    Alert(
                        {
                            **labels,
                            "alertname": "TrainingPythonTraceback",
                            "signal": "app_error",
                            "node": n,
                        },
                        at,
                        at + timedelta(minutes=5),
                    )
                )
        run(ended, state, 1 if state == "FAILED" else 0)
        if kind == "node":  # Slurm requeues a --requeue job it lost
            attempt += 1
            t = ended + timedelta(minutes=rng.uniform(2, 5))
            length = end - at
            continue
        roll = rng.random()
        if roll < 0.5:  # its user resubmits it, a while later
            h.people["resubmits"] += 1
            return ended + timedelta(hours=rng.uniform(1, 6)), True
        if roll < 0.7:  # an operator requeues it
            h.people["requeues"] += 1
            attempt += 1
            t = ended + timedelta(minutes=rng.uniform(20, 120))
            length = end - at
            continue
        return ended + timedelta(minutes=rng.uniform(5, 30)), False
