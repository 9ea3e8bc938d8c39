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
import time

from bench.lablib import enforcing_lab, executed_at, finish_round, report, running_nodes, wait
from lab import api, manage
from lab.config import LabConfig
from webhook.ledger.store import Ledger


def one_round(cfg: LabConfig, ledger: Ledger, settle: float) -> dict[str, float]:
    job = manage.submit_training(cfg, nodes=2, step_time=0.2)
    nodes = running_nodes(cfg, job)
    wait(lambda: api.query(cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}'))
    last_alert = ledger.last_alert_id()
    t_fault = time.time()
    manage.inject_gpu(cfg, "xid", nodes[0], 0, xid=79)
    decided, executed = wait(lambda: executed_at(ledger, f"{job}.0", "drain"))
    received = min(
        t.timestamp()
        for _, t, a in ledger.alerts_after(last_alert)
        if a.labels.get("alertname") == "GpuXidNodeFault" and a.labels.get("node") == nodes[0]
    )
    finish_round(cfg, ledger, job, nodes[0])
    return {
        "detection": received - t_fault,
        "settle+decision": decided - received,
        "execution": executed - decided,
        "total": executed - t_fault,
        "own": executed - received - settle,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--settle", type=float, default=5.0)
    args = p.parse_args()
    with enforcing_lab(23000, args.settle) as (cfg, ledger):
        rows = [one_round(cfg, ledger, args.settle) for _ in range(args.rounds)]
    floor = 1 + 1 + 0 + args.settle  # scrape 1 s + evaluation 1 s + group_wait 0 s + settle
    print(
        f"{len(rows)} rounds, XID 79 -> drain executed, enforce mode, settle {args.settle:g}s "
        f"(floor {floor:g}s: scrape 1s + evaluation 1s + group_wait 0s + settle)"
    )
    report(rows, {"own": "slurmedic's own (receipt -> executed - settle)"})


if __name__ == "__main__":
    main()
