"""Capture what a release of Slurm prints, for the adapter's tests: run against a lab
(`SLURMEDIC_LAB_DIR`, `SLURMEDIC_LAB_PORT_BASE` of one that is up, on any stack):

    python tests/data/slurm/capture.py tests/data/slurm

It makes the states the adapter must read (a running job with a comment, a drained node, a
node that stopped answering, a job requeued and held, a cancelled job, a pending job) and
writes `<release>/` with every command slurmedic reads on that release.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from lab import manage
from lab.config import LabConfig
from lab.slurm import slurm


def wait(cfg: LabConfig, job: int, state: str) -> None:
    for _ in range(100):
        if manage.show_job(cfg, job).get("JobState") == state:
            return
        time.sleep(0.2)
    raise SystemExit(f"job {job} never {state}")


def main() -> None:
    cfg = LabConfig.from_env()
    out_root = Path(sys.argv[1])
    version = slurm(cfg, "scontrol", "--version").split()[-1]
    out = out_root / version
    out.mkdir(parents=True, exist_ok=True)
    manage.clear(cfg)
    slurm(cfg, "scontrol", "update", "nodename=gpu[01-08]", "state=resume", check=False)
    comment = json.dumps({"slurmedic": {"max_requeues": 2}})
    running = manage.submit_training(cfg, nodes=2, comment=comment)
    held = manage.submit_training(cfg, nodes=2, name="to-requeue")
    cancelled = manage.submit_training(cfg, nodes=1, partition="debug", name="to-cancel")
    for job in (running, held, cancelled):
        wait(cfg, job, "RUNNING")
    slurm(cfg, "scancel", str(cancelled))
    wait(cfg, cancelled, "CANCELLED")
    slurm(cfg, "scontrol", "requeuehold", str(held))
    pending = manage.submit_training(cfg, nodes=6, name="waits")  # more than is free
    free = [n for n, s in manage.slurm.node_states(cfg).items() if s == "idle"]
    slurm(cfg, "scontrol", "update", f"nodename={free[0]}", "state=drain", "reason=xid 79 on GPU 3")
    manage.kill_node(cfg, free[1])  # no answer for SlurmdTimeout: DOWN, NOT_RESPONDING
    for _ in range(150):
        if manage.slurm.node_states(cfg)[free[1]].startswith("down"):
            break
        time.sleep(0.2)
    else:
        raise SystemExit(f"{free[1]} never down")
    # What slurmedic reads on this release (and sinfo's grouped JSON of 23.02+, once, for the
    # test that it is refused clearly).
    commands = {
        "version.txt": ["scontrol", "--version"],
        "topology.txt": ["scontrol", "show", "topology"],
        "sinfo.json": ["sinfo", "--json"],
    }
    if version.startswith("22."):
        commands["squeue.json"] = ["squeue", "--json", "--states=all"]
    else:
        commands["nodes.json"] = ["scontrol", "show", "nodes", "--json"]
        commands["jobs.json"] = ["scontrol", "show", "jobs", "--json"]
    for name, argv in commands.items():
        (out / name).write_text(slurm(cfg, *argv))
    (out / "made.json").write_text(
        json.dumps(
            {
                "running": running,
                "requeue_held": held,
                "cancelled": cancelled,
                "pending": pending,
                "drained": free[0],
                "down": free[1],
                "comment": comment,
            },
            indent=1,
        )
        + "\n"
    )
    slurm(cfg, "scancel", str(running), str(held), str(pending))
    manage.clear(cfg)
    slurm(cfg, "scontrol", "update", f"nodename={free[0]}", "state=resume", check=False)
    print(out)


if __name__ == "__main__":
    main()
