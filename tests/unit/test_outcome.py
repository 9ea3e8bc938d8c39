"""What Slurm shows after a run, against the decision (webhook/core/outcome.py), and the
notice a mismatch raises."""

from __future__ import annotations

from datetime import UTC, datetime

from webhook.core.notices import Open, as_alert, notices
from webhook.core.outcome import drain_mismatch, requeue_mismatch

REASON = "slurmedic: 7.0 gpu_hardware"


def test_a_requeue_leaves_one_restart_more() -> None:
    assert requeue_mismatch(7, 0, {"JobState": "PENDING", "Restarts": "1"}) is None
    assert requeue_mismatch(7, 3, {"Restarts": "4"}) is None


def test_a_double_requeue_is_a_mismatch() -> None:
    what = requeue_mismatch(7, 0, {"JobState": "PENDING", "Restarts": "2"})
    assert what is not None
    assert "2 restarts of job 7" in what and "requeued more than once" in what


def test_a_requeue_that_did_not_take_is_a_mismatch() -> None:
    what = requeue_mismatch(7, 1, {"Restarts": "1"})
    assert what is not None and "not requeued" in what


def test_a_job_slurm_forgot_cannot_be_checked() -> None:
    assert requeue_mismatch(7, 0, {"JobState": "GONE", "Restarts": "?"}) is None
    assert requeue_mismatch(7, 0, {"Restarts": "²"}) is None


def test_a_drain_shows_its_own_reason() -> None:
    after = {
        "State": {"gpu02": "MIXED+DRAIN"},
        "Reason": {"gpu02": REASON},
    }
    assert drain_mismatch(["gpu02"], REASON, {"gpu02": "MIXED"}, after) is None


def test_a_drain_whose_reason_is_someone_else_s_is_a_mismatch() -> None:
    after = {
        "State": {"gpu02": "IDLE+DRAIN", "gpu03": "IDLE"},
        "Reason": {"gpu02": "bad fan", "gpu03": ""},
    }
    what = drain_mismatch(["gpu02", "gpu03"], REASON, {"gpu02": "IDLE", "gpu03": "IDLE"}, after)
    assert what is not None
    assert "gpu02 is IDLE+DRAIN with reason 'bad fan'" in what
    assert "gpu03 is IDLE with reason '(none)'" in what


def test_a_node_drained_before_the_run_is_left_alone_and_not_checked() -> None:
    after = {"State": {"gpu02": "IDLE+DRAIN"}, "Reason": {"gpu02": "an operator's"}}
    assert drain_mismatch(["gpu02"], REASON, {"gpu02": "IDLE+DRAIN"}, after) is None


def test_a_mismatch_is_a_notice_until_a_verdict() -> None:
    at = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
    row = Open(4, "7.0", 7, "requeue", "gpu_hardware", None, "executed", "GPU fell off", at, "x2")
    (notice,) = notices([row], at)
    assert notice.kind == "mismatch" and notice.reason == "x2"
    alert = as_alert(notice, at, at - at, "")
    assert alert["labels"]["alertname"] == "SlurmedicActionMismatch"
    assert alert["labels"]["severity"] == "critical"
    # Without a mismatch, an executed requeue needs nobody.
    assert (
        notices([Open(4, "7.0", 7, "requeue", "gpu_hardware", None, "executed", "", at)], at) == []
    )
