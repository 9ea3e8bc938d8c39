"""requeue_job when Slurm requeues the job itself (a --requeue job whose node failed) while the
playbook runs: the real races seen in CI, made deterministic with a stand-in `scontrol` that
answers as Slurm does (its messages as Slurm 22.05 to 26.05 print them).

- Slurm requeues it between the playbook's read and its requeuehold: the playbook must exclude
  the nodes and must not release the job (it is pending, not held).
- Slurm's successor starts (after Slurm's requeue delay) before the exclusion: Slurm refuses
  it; the run succeeds if the successor is clear of the implicated nodes, and fails, naming
  them, if it is not.
- The successor already runs when the playbook reads the job: nothing to do but that check.
- Each command reads the job again first (playbooks/library/slurmedic_act.py): one requeued
  since the plan's read is not requeued again; and none runs once the replica's fence has run
  out (webhook/executor/fence.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from webhook.executor.fence import Fence
from webhook.executor.runner import RunResult, run_playbook

RUNNING_0 = "JobId=24 JobName=x JobState=RUNNING Reason=None Restarts=0 ExcNodeList=(null)"
PENDING_1 = "JobId=24 JobName=x JobState=PENDING Reason=BeginTime Restarts=1 ExcNodeList=(null)"
RUNNING_1 = (
    "JobId=24 JobName=x JobState=RUNNING Reason=None Restarts=1 ExcNodeList=(null) "
    "ReqNodeList=(null) NodeList={nodes} BatchHost=gpu04"
)
NOT_PENDING = "Job is no longer pending execution for job 24"

# `show job` answers the lines of $SHOWS in turn (the last one from then on).
SCONTROL = """#!/bin/sh
echo "$@" >> "{log}"
n=$(grep -c '^show job' "{log}")
case "$1 $2" in
  "show job") sed -n "$(( n < {shows} ? n : {shows} ))p" "{shows_file}";;
  "show hostnames") echo "$3" | sed 's/gpu\\[\\(..\\)-\\(..\\)\\]/\\1 \\2/' \\
    | {{ read a b; seq -f 'gpu%02g' $a $b; }};;
  requeuehold*) {requeuehold};;
  update*) {update};;
  *) exit 0;;
esac
"""


def run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shows: list[str],
    requeuehold: str = "exit 0",
    update: str = "exit 0",
    fence: Path | None = None,
) -> tuple[RunResult, list[str]]:
    log = tmp_path / "calls.log"
    log.touch()
    shows_file = tmp_path / "shows"
    shows_file.write_text("".join(f"{s}\n" for s in shows))
    fake = tmp_path / "scontrol"
    fake.write_text(
        SCONTROL.format(
            log=log, shows=len(shows), shows_file=shows_file, requeuehold=requeuehold, update=update
        )
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = run_playbook(
        "requeue_job",
        {"slurmedic_job": 24, "slurmedic_attempt": 0, "slurmedic_exclude": ["gpu03"]}
        | ({"slurmedic_fence": str(fence)} if fence else {}),
        check=False,
    )
    return result, log.read_text().splitlines()


def test_slurm_requeued_it_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Between the requeuehold's own read and the command: Slurm answers it is pending.
    result, calls = run(
        tmp_path,
        monkeypatch,
        [RUNNING_0, RUNNING_0, PENDING_1],
        requeuehold='echo "Job is pending execution for job 24" >&2; exit 1',
    )
    assert result.ok, result.output[-2000:]
    assert calls == [
        "show job 24 --oneliner",
        "show job 24 --oneliner",
        "requeuehold 24",
        "show job 24 --oneliner",
        "update jobid=24 ExcNodeList=gpu03",
        "show job 24 --oneliner",
    ]
    assert result.after == {"JobState": "PENDING", "Restarts": "1"}


def test_slurm_requeued_it_after_the_plan_s_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The requeuehold's own read sees one restart more: no requeuehold is sent at all.
    result, calls = run(tmp_path, monkeypatch, [RUNNING_0, PENDING_1])
    assert result.ok, result.output[-2000:]
    assert calls == [
        "show job 24 --oneliner",
        "show job 24 --oneliner",
        "show job 24 --oneliner",
        "update jobid=24 ExcNodeList=gpu03",
        "show job 24 --oneliner",
    ]


def test_the_successor_started_before_the_exclusion_clear_of_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, calls = run(
        tmp_path,
        monkeypatch,
        [PENDING_1, PENDING_1, RUNNING_1.format(nodes="gpu[04-06]")],
        update=f'echo "{NOT_PENDING}" >&2; exit 1',
    )
    assert result.ok, result.output[-2000:]
    assert calls == [
        "show job 24 --oneliner",
        "show job 24 --oneliner",
        "update jobid=24 ExcNodeList=gpu03",
        "show job 24 --oneliner",
        "show hostnames gpu[04-06]",
        "show job 24 --oneliner",
    ]
    assert "release" not in "".join(calls)
    assert result.summary()["successor_nodes"] == ["gpu04", "gpu05", "gpu06"]


def test_the_successor_started_before_the_exclusion_s_own_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The exclusion's read already shows it running: no update is sent.
    result, calls = run(tmp_path, monkeypatch, [PENDING_1, RUNNING_1.format(nodes="gpu[04-06]")])
    assert result.ok, result.output[-2000:]
    assert not [c for c in calls if c.startswith("update")]
    assert result.successor_nodes == ["gpu04", "gpu05", "gpu06"]


def test_the_successor_started_before_the_exclusion_on_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, _ = run(
        tmp_path,
        monkeypatch,
        [PENDING_1, PENDING_1, RUNNING_1.format(nodes="gpu[02-04]")],
        update=f'echo "{NOT_PENDING}" >&2; exit 1',
    )
    assert not result.ok
    assert "before the exclusion, on gpu03 of the implicated nodes" in result.output


def test_another_refusal_of_the_exclusion_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, calls = run(
        tmp_path,
        monkeypatch,
        [PENDING_1],
        update='echo "Invalid node name specified" >&2; exit 1',
    )
    assert not result.ok
    assert calls[-1] == "update jobid=24 ExcNodeList=gpu03"


def test_the_successor_already_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, calls = run(tmp_path, monkeypatch, [RUNNING_1.format(nodes="gpu[04-06]")])
    assert result.ok, result.output[-2000:]
    assert result.commands == []
    assert result.successor_nodes == ["gpu04", "gpu05", "gpu06"]
    assert calls == [
        "show job 24 --oneliner",
        "show job 24 --oneliner",
        "show hostnames gpu[04-06]",
        "show job 24 --oneliner",
    ]


def test_nothing_is_sent_once_the_fence_has_run_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fence = Fence(tmp_path / "fence")
    fence.extend(time.time() - 0.5)  # the lease this replica held ended half a second ago
    result, calls = run(tmp_path, monkeypatch, [RUNNING_0], fence=fence.path)
    assert not result.ok and result.fenced
    assert calls == ["show job 24 --oneliner"]  # the plan's read, and nothing after it
    assert "fenced: the term that decided this may have ended" in result.output


def test_a_fence_still_running_lets_the_requeue_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fence = Fence(tmp_path / "fence")
    fence.extend(time.time() + 60)
    result, calls = run(
        tmp_path,
        monkeypatch,
        [RUNNING_0, RUNNING_0, PENDING_1 + " Reason=job_requeued_in_held_state"],
        fence=fence.path,
    )
    assert result.ok and not result.fenced, result.output[-2000:]
    assert [c for c in calls if not c.startswith("show")] == [
        "requeuehold 24",
        "update jobid=24 ExcNodeList=gpu03",
        "release 24",
    ]
    assert len(result.windows) == 3 and all(w >= 0 for w in result.windows)
