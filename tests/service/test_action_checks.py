"""Every act checked after the fact, and none made once the fence has run out: the executor
with real ansible-runner and the real playbooks, against a stand-in `scontrol` that answers as
Slurm does and logs its calls (the lab's fault tests do the same against real Slurm:
tests/lab/test_replicas.py).

- A requeue after which Slurm counts two restarts (someone requeued it too) is executed, and
  its mismatch recorded, counted and escalated.
- A drain after which the node shows someone else's reason: the same.
- A run whose replica's fence has run out sends Slurm nothing and is left `running` for the
  leader (it may have lost its lease).
- A drain whose result could not be written (the database went away) is not a failed drain:
  its requeue waits, and the next step carries both out."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from tests.service.conftest import stand_in
from tests.service.test_replicas import T0, requeue
from webhook.core.decisions import Decision
from webhook.core.lifecycle import EXECUTED, PENDING, RUNNING
from webhook.core.notices import notices
from webhook.executor.dispatch import Dispatcher
from webhook.executor.fence import Fence
from webhook.ledger import review
from webhook.ledger.store import Ledger

# `show job` answers Restarts=0 for the plan's read and the requeuehold's, then what $AFTER
# holds; `show node` the same with $NODE_AFTER once the drain has been sent.
SCONTROL = """#!/bin/sh
echo "$@" >> "{log}"
case "$1 $2" in
  "show job")
    if grep -q '^release' "{log}"; then
      echo "JobId=$3 JobName=x JobState=PENDING Reason=BeginTime Restarts={after}"
    elif grep -q '^requeuehold' "{log}"; then
      echo "JobId=$3 JobName=x JobState=PENDING Reason=job_requeued_in_held_state Restarts=1"
    else
      echo "JobId=$3 JobName=x JobState=RUNNING Reason=None Restarts=0 ExcNodeList=(null)"
    fi;;
  "show node")
    if grep -q 'state=drain' "{log}"; then
      echo "NodeName=$3 State=MIXED+DRAIN ThreadsPerCore=1 Reason={reason} [root@2026-12-06]"
    else
      echo "NodeName=$3 Arch=x86_64 State=MIXED ThreadsPerCore=1 Reason=(null)"
    fi;;
esac
"""


def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: int, reason: str) -> Path:
    log = tmp_path / "calls.log"
    log.touch()
    stand_in(
        tmp_path, monkeypatch, "scontrol", SCONTROL.format(log=log, after=after, reason=reason)
    )
    return log


def drain(incident: str = "7.0") -> Decision:
    return Decision(
        at=datetime.now(UTC),
        incident=incident,
        job=7,
        action="drain",
        cause="gpu_hardware",
        reason="XID 79 on gpu02",
        mode="enforce",
        state=PENDING,
        nodes=("gpu02",),
    )


def run(ledger: Ledger, decision: Decision, fence: Path | None = None) -> int:
    [rid] = ledger.record([decision])
    dispatcher = Dispatcher(ledger, fence=fence, backoff=0.01)
    try:
        dispatcher._run_incident(ledger.rows([rid]))  # in this thread
    finally:
        dispatcher.close()
    return rid


def test_a_double_requeue_is_recorded_counted_and_escalated(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm(tmp_path, monkeypatch, after=2, reason="x")
    rid = run(ledger, requeue("7.0"))
    row = ledger.rows([rid])[0]
    assert row.state == EXECUTED  # what it set out to do, it did
    assert row.mismatch is not None and "Slurm counts 2 restarts of job 7" in row.mismatch
    assert "requeued more than once" in row.mismatch
    # Escalated: a notice until someone records a verdict, and counted.
    since = T0 - timedelta(days=1)
    (notice,) = [n for n in notices(review.needs_human(ledger, since), T0) if n.decision_id == rid]
    assert notice.kind == "mismatch"
    assert [(m.action, m.n) for m in ledger.figures().mismatches] == [("requeue", 1)]


def test_a_requeue_that_did_what_it_should_has_no_mismatch(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm(tmp_path, monkeypatch, after=1, reason="x")
    rid = run(ledger, requeue("7.0"))
    row = ledger.rows([rid])[0]
    assert (row.state, row.mismatch) == (EXECUTED, None)
    assert ledger.figures().mismatches == []


def test_a_drain_whose_reason_is_someone_else_s_is_a_mismatch(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm(tmp_path, monkeypatch, after=1, reason="bad fan")
    rid = run(ledger, drain())
    row = ledger.rows([rid])[0]
    assert row.state == EXECUTED
    assert row.mismatch is not None and "gpu02 is MIXED+DRAIN with reason 'bad fan'" in row.mismatch


def test_a_drain_with_its_own_reason_has_no_mismatch(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm(tmp_path, monkeypatch, after=1, reason="slurmedic: 7.0 gpu_hardware")
    rid = run(ledger, drain())
    assert ledger.rows([rid])[0].mismatch is None


def test_a_run_whose_fence_ran_out_sends_nothing_and_is_left_running(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = slurm(tmp_path, monkeypatch, after=1, reason="x")
    fence = Fence(tmp_path / "fence")
    fence.extend(time.time() - 1)  # its lease ended a second ago
    rid = run(ledger, requeue("7.0"), fence=fence.path)
    assert ledger.rows([rid])[0].state == RUNNING  # the leader runs it again
    assert [c for c in calls.read_text().splitlines() if not c.startswith("show")] == []


class CutOffOnce(Ledger):
    """A ledger whose first write of a drain's result fails, as when the database goes away
    while the playbook runs."""

    cut = False

    def add_event(self, decision_id: int, state: str, detail: dict[str, Any], at: datetime) -> None:
        if state == EXECUTED and not self.cut:
            self.cut = True
            raise OperationalError("UPDATE", {}, Exception("server closed the connection"))
        super().add_event(decision_id, state, detail, at)


def test_a_drain_whose_result_could_not_be_recorded_leaves_its_requeue_waiting(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm(tmp_path, monkeypatch, after=1, reason="slurmedic: 7.0 gpu_hardware")
    cut = CutOffOnce(ledger.url)
    ids = cut.record([drain(), requeue("7.0")])
    dispatcher = Dispatcher(cut, backoff=0.01)
    try:
        dispatcher._run_incident(sorted(cut.rows(ids), key=lambda r: r.id))
        # The ledger's error is not the drain's failure: nothing failed, the drain is still
        # claimed, the requeue still waits.
        assert {r.action: r.state for r in cut.rows(ids)} == {"drain": RUNNING, "requeue": PENDING}
        # The next step carries both out.
        dispatcher._run_incident(sorted(cut.rows(ids), key=lambda r: r.id))
        assert {r.state for r in cut.rows(ids)} == {EXECUTED}
    finally:
        dispatcher.close()
