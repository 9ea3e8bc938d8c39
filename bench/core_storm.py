"""The decision core under a storm: 10,000 alerts over 2,048 nodes and 256 jobs.

Builds a cluster of 2,048 nodes (16 leaf switches of 128) running 256 jobs of 8 nodes, and a
storm of alerts as Alertmanager would deliver them (payloads of 10), mixing every signal: GPU
faults on a few nodes, NCCL timeouts from the others' ranks, application errors, stragglers,
re-deliveries of each. Feeds it through the real engine on a simulated clock and prints
alerts/s, the time to decide every incident, and peak memory.

    .venv/bin/python -m bench.core_storm [--alerts 10000]
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc
from collections import Counter
from datetime import UTC, datetime, timedelta

from webhook.core.alerts import Alert, wrap
from webhook.core.cluster import ClusterView, Job, Node
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--alerts", type=int, default=10_000)
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--jobs", type=int, default=256)
    p.add_argument("--redeliver", type=float, default=0.2, help="share of payloads sent twice")
    args = p.parse_args()
    rng = random.Random(7)
    view = cluster(args.nodes, args.jobs)
    alerts = storm(view, args.alerts, rng)
    payloads = [wrap(alerts[i : i + 10]) for i in range(0, len(alerts), 10)]
    deliveries = []
    for pl in payloads:
        deliveries.append(pl)
        if rng.random() < args.redeliver:
            deliveries.append(pl)  # an HA peer's copy
    engine = Engine(view=view, policy=Policy(breaker={"max_fraction": 1.0}))  # type: ignore[arg-type]

    tracemalloc.start()
    t0 = time.perf_counter()
    decisions = []
    for i, pl in enumerate(deliveries):
        engine.receive(pl, pl.alerts[0].startsAt + timedelta(seconds=1))
        if i % 50 == 0:
            decisions += engine.tick(pl.alerts[0].startsAt)
    t_ingest = time.perf_counter() - t0
    decisions += engine.tick(T0 + timedelta(hours=1))
    t_total = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    decided = sum(1 for i in engine.incidents.values() if i.decided)
    print(
        f"{len(alerts):,} alerts in {len(deliveries):,} deliveries "
        f"({len(deliveries) - len(payloads)} re-deliveries) "
        f"over {args.nodes:,} nodes and {args.jobs} jobs"
    )
    print(
        f"ingest {t_ingest:.3f}s = {len(alerts) / t_ingest:,.0f} alerts/s; "
        f"everything decided in {t_total:.3f}s; peak traced memory {peak / 2**20:.1f} MiB"
    )
    print(
        f"{decided} incidents decided; decisions by action/cause: "
        + ", ".join(
            f"{a}/{c}={n}"
            for (a, c), n in sorted(Counter((d.action, d.cause) for d in decisions).items())
        )
    )


if __name__ == "__main__":
    main()
