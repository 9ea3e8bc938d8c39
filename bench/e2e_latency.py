"""End-to-end latency in the lab, enforce mode: fault injected -> drain executed in Slurm.

Brings up a lab of its own (port base 23000), runs `slurmedic serve` with an enforce policy,
and for each round submits a training job, waits for its GPUs to be mapped, injects XID 79 on
one of its nodes and reads the timestamps the ledger keeps. Splits the time into detection
(fault -> alert received by the webhook: exporter scrape + rule evaluation + Alertmanager),
settle (the policy's window), decision (settle end -> decision recorded) and execution
(decision -> drain executed: ansible-runner + scontrol), next to the floor the configuration
allows (scrape + evaluation + group_wait + settle).

    .venv/bin/python -m bench.e2e_latency [--rounds 3] [--settle 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.lablib import enforcing_lab, finish_round, running_nodes, wait
from lab import api, manage


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--settle", type=float, default=5.0)
    args = p.parse_args()
    rows = []
    with enforcing_lab(23000, args.settle) as (cfg, ledger):
        for _ in range(args.rounds):
            job = manage.submit_training(cfg, nodes=2, step_time=0.2)
            nodes = running_nodes(cfg, job)
            wait(lambda job=job: api.query(cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}'))
            t_fault = time.time()
            manage.inject_gpu(cfg, "xid", nodes[0], 0, xid=79)
            drain = wait(
                lambda job=job: next(
                    (
                        r
                        for r in ledger.decisions(50)
                        if r.incident == f"{job}.0"
                        and r.action == "drain"
                        and r.state == "executed"
                    ),
                    None,
                )
            )
            received = min(
                t.timestamp()
                for _, t, a in ledger.alerts_after(0, 100000)
                if a.labels.get("alertname") == "GpuXidNodeFault"
                and a.labels.get("node") == nodes[0]
                and a.startsAt.timestamp() >= t_fault - 2
            )
            _, events = ledger.decision(drain.id)  # type: ignore[misc]
            at = {e.state: e.at.timestamp() for e in events}
            decided = drain.at.timestamp()
            rows.append(
                {
                    "detection": received - t_fault,
                    "settle+decision": decided - received,
                    "execution": at["executed"] - decided,
                    "total": at["executed"] - t_fault,
                    "own": at["executed"] - received - args.settle,
                }
            )
            finish_round(cfg, ledger, job, nodes[0])
    floor = 1 + 1 + 0 + args.settle  # scrape 1 s + evaluation 1 s + group_wait 0 s + settle
    print(
        f"{len(rows)} rounds, XID 79 -> drain executed, enforce mode, settle {args.settle:g}s "
        f"(floor {floor:g}s: scrape 1s + evaluation 1s + group_wait 0s + settle)"
    )
    for key in ("detection", "settle+decision", "execution", "total", "own"):
        values = [r[key] for r in rows]
        label = "slurmedic's own (receipt -> executed - settle)" if key == "own" else key
        print(
            f"  {label:48} median {statistics.median(values):5.2f}s  "
            f"(min {min(values):.2f}, max {max(values):.2f})"
        )


if __name__ == "__main__":
    main()
