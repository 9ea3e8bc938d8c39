"""What people see of nodes and their repairs (webhook/core/repair_view.py): the nodes waiting
for replacement first, then the lemons; a node back in service no longer waits; when a
repaired node returned; a step in one line."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from webhook.core.failures import NodeRecord
from webhook.core.repair_view import awaiting_replacement, node_views, returned_at, step_text
from webhook.core.repairs import Drained, Repair, Step

T = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def record(node: str, failures: int) -> NodeRecord:
    return NodeRecord(node, failures, failures, 0, ("gpu_hardware",), (), 1, T, T, failures > 1)


def repair(node: str, state: str, seq: int = 1, *steps: Step) -> Repair:
    d = Drained(node, seq, f"node:{node}", "gpu_hardware", T, True)
    return Repair(node, seq, d, "reboot", "GpuMissing", T, state, T, steps)


def test_a_node_waiting_for_replacement_comes_before_the_lemons() -> None:
    records = [record("gpu01", 3), record("gpu02", 2), record("gpu03", 1)]
    found = [
        (repair("gpu03", "replace"), "its health check failed"),
        (repair("gpu01", "repairing"), "reboot it"),
    ]
    views = node_views(records, found, {"gpu03": "drained", "gpu01": "drained"})
    assert [v.node for v in views] == ["gpu03", "gpu01", "gpu02"]
    assert views[0].latest is not None and views[0].latest.reason == "its health check failed"
    assert views[2].latest is None and views[2].status is None
    # Replaced and back in service: it waits no more, and the lemons lead again.
    back = node_views(records, found, {"gpu03": "idle", "gpu01": "drained"})
    assert [v.node for v in back] == ["gpu01", "gpu02", "gpu03"]


def test_the_latest_repair_is_the_one_that_counts() -> None:
    # Newest first, as the ledger lists them: the node's second repair is under way.
    found = [(repair("gpu04", "waiting", 2), ""), (repair("gpu04", "replace", 1), "")]
    (view,) = node_views([], found, {})
    assert view.record is None and len(view.repairs) == 2 and not view.awaiting_replacement


def test_awaiting_replacement_until_slurm_shows_the_node_in_service() -> None:
    for status in (None, "drained", "down*", "draining", "idle*", "maint"):
        assert awaiting_replacement("replace", status), status
    for status in ("idle", "mixed", "allocated"):
        assert not awaiting_replacement("replace", status), status
    assert not awaiting_replacement("probation", "drained")


def test_returned_when_its_resume_ran() -> None:
    back = T + timedelta(minutes=40)
    resume = Step(9, "resume", "executed", T + timedelta(minutes=35), done_at=back)
    assert returned_at(repair("gpu05", "probation", 1, resume)) == back
    assert returned_at(repair("gpu05", "resuming", 1, replace(resume, state="pending"))) is None
    assert returned_at(repair("gpu05", "checking")) is None


def test_a_step_in_one_line() -> None:
    check = Step(41, "health_check", "executed", T, T, False, "exit 1: GPU 3 memory: FAIL")
    assert step_text(check) == "health_check #41 executed (failed: exit 1: GPU 3 memory: FAIL)"
    assert step_text(replace(check, passed=True, detail="")) == "health_check #41 executed (passed)"
    assert step_text(Step(40, "reboot", "running", T)) == "reboot #40 running"
    failed = Step(40, "reboot", "failed", T, detail="unreachable")
    assert step_text(failed) == "reboot #40 failed (unreachable)"
