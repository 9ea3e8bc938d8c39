"""requeue_job when Slurm requeues the job itself between the playbook's read and its
requeuehold (a --requeue job whose node failed): the real race seen in CI, made deterministic
with a stand-in `scontrol` that answers as Slurm 22.05 does. The playbook must exclude the
nodes and must not release the job (it is pending, not held)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from webhook.executor.runner import run_playbook

SCONTROL = """#!/bin/sh
echo "$@" >> "{log}"
case "$1" in
  show) echo "JobId=24 JobName=x JobState=RUNNING Reason=None Restarts=0 ExcNodeList=(null)";;
  requeuehold) echo "Job is pending execution for job 24" >&2; exit 1;;
  *) exit 0;;
esac
"""


def test_slurm_requeued_it_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.log"
    fake = tmp_path / "scontrol"
    fake.write_text(SCONTROL.format(log=log))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = run_playbook(
        "requeue_job",
        {"slurmedic_job": 24, "slurmedic_attempt": 0, "slurmedic_exclude": ["gpu03"]},
        check=False,
    )
    assert result.ok, result.output[-2000:]
    assert log.read_text().splitlines() == [
        "show job 24 --oneliner",
        "requeuehold 24",
        "update jobid=24 ExcNodeList=gpu03",
    ]
