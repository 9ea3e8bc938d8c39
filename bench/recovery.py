"""Recovery in the lab, enforce mode: fault -> drain + requeue -> the successor resumes -> verified.

Brings up a lab of its own (port base 24000), runs `slurmedic serve` with an enforce policy
and verification, and for each round submits a training job (checkpoint every 10 steps), lets
it train past a checkpoint, injects XID 79 on one of its nodes and reads what slurmedic
recorded: recovery latency (fault -> requeue executed), time to restore productive training
(fault -> the successor passed the step at failure, as verified), the work lost (training since
the last checkpoint) and the job's ETTR over the round from the goodput recording rules. The
lab's floor for the time to restore: detection (~1 s) + settle + requeue + Slurm starting the
successor + replaying the steps since the checkpoint.

    .venv/bin/python -m bench.recovery [--rounds 3] [--settle 5]
"""

from __future__ import annotations

import argparse
import time

from bench.lablib import enforcing_lab, executed_at, finish_round, report, running_nodes, wait
from lab import api, manage
from lab.config import LabConfig
from webhook.ledger.store import Ledger


def one_round(cfg: LabConfig, ledger: Ledger) -> tuple[str, dict[str, float]]:
    job = manage.submit_training(cfg, nodes=3, step_time=0.3, ckpt_every=10)
    nodes = running_nodes(cfg, job)
    ckpt = f'min(training_last_checkpoint_step{{slurm_job_id="{job}"}}) >= 10'
    wait(lambda: api.query(cfg, ckpt), timeout=180, interval=0.2)
    time.sleep(1.5)  # a few steps past the checkpoint: work that will be lost
    t_fault = time.time()
    manage.inject_gpu(cfg, "xid", nodes[1], 0, xid=79)
    rec = wait(
        lambda: next((r for r in ledger.recoveries("recovered", "failed") if r.job == job), None),
        timeout=180,
        interval=0.2,
    )
    done = executed_at(ledger, f"{job}.0", "requeue")
    assert done is not None, "a recovery is watched only after its requeue ran"
    ettr = api.query(cfg, f'slurmedic:job_ettr:ratio{{slurm_job_id="{job}"}}')
    finish_round(cfg, ledger, job, nodes[1])
    fault = rec.fault_at.timestamp()
    return rec.state, {
        "detection": fault - t_fault,
        "recovery latency (fault -> requeue executed)": done[1] - t_fault,
        "time to restore (fault -> step at failure passed)": (
            (rec.restored_seconds or 0) + fault - t_fault
        ),
        "work lost (since checkpoint)": rec.work_lost_seconds or 0.0,
        "steps replayed": (rec.failed_step or 0) - (rec.checkpoint_step or 0),
        "job ETTR over the round": ettr[0]["value"] if ettr else float("nan"),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--settle", type=float, default=5.0)
    args = p.parse_args()
    with enforcing_lab(24000, args.settle, verify={"deadline": "120s"}) as (cfg, ledger):
        results = [one_round(cfg, ledger) for _ in range(args.rounds)]
    outcomes = [outcome for outcome, _ in results]
    rows = [row for _, row in results]
    print(
        f"{len(rows)} rounds, XID 79 on one of 3 nodes, enforce, settle {args.settle:g}s, "
        f"step 0.3s, checkpoint every 10 steps: {outcomes.count('recovered')} recovered, "
        f"{outcomes.count('failed')} failed"
    )
    report(rows)


if __name__ == "__main__":
    main()
