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
    with enforcing_lab(24000, args.settle, verify={"deadline": "120s"}) as (cfg, ledger):
        for _ in range(args.rounds):
            job = manage.submit_training(cfg, nodes=3, step_time=0.3, ckpt_every=10)
            nodes = running_nodes(cfg, job)
            ckpt = f'min(training_last_checkpoint_step{{slurm_job_id="{job}"}}) >= 10'
            wait(lambda ckpt=ckpt: api.query(cfg, ckpt), timeout=180, interval=0.2)
            time.sleep(1.5)  # a few steps past the checkpoint: work that will be lost
            t_fault = time.time()
            manage.inject_gpu(cfg, "xid", nodes[1], 0, xid=79)
            rec = wait(
                lambda job=job: next(
                    (r for r in ledger.recoveries("recovered", "failed") if r.job == job), None
                ),
                timeout=180,
                interval=0.2,
            )
            requeue = next(
                r for r in ledger.incident_decisions(f"{job}.0") if r.action == "requeue"
            )
            _, events = ledger.decision(requeue.id)  # type: ignore[misc]
            executed = next(e.at.timestamp() for e in events if e.state == "executed")
            ettr = api.query(cfg, f'slurmedic:job_ettr:ratio{{slurm_job_id="{job}"}}')
            rows.append(
                {
                    "outcome": rec.state,
                    "detection": rec.fault_at.timestamp() - t_fault,
                    "recovery latency (fault -> requeue executed)": executed - t_fault,
                    "time to restore (fault -> step at failure passed)": (
                        (rec.restored_seconds or 0) + rec.fault_at.timestamp() - t_fault
                    ),
                    "work lost (since checkpoint)": rec.work_lost_seconds or 0.0,
                    "steps replayed": (rec.failed_step or 0) - (rec.checkpoint_step or 0),
                    "job ETTR over the round": ettr[0]["value"] if ettr else float("nan"),
                }
            )
            finish_round(cfg, ledger, job, nodes[1])
    outcomes = [r.pop("outcome") for r in rows]
    print(
        f"{len(rows)} rounds, XID 79 on one of 3 nodes, enforce, settle {args.settle:g}s, "
        f"step 0.3s, checkpoint every 10 steps: {outcomes.count('recovered')} recovered, "
        f"{outcomes.count('failed')} failed"
    )
    for key in rows[0] if rows else []:
        values = [r[key] for r in rows]
        print(
            f"  {key:52} median {statistics.median(values):7.2f}  "
            f"(min {min(values):.2f}, max {max(values):.2f})"
        )


if __name__ == "__main__":
    main()
