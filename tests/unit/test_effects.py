"""What a requeue or stop did to its attempt, from the job as its run read it before acting."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core.effects import ENDED, INTERRUPTED, REQUEUED, effect, first_before


@pytest.mark.parametrize(
    ("action", "before", "expected"),
    [
        ("stop", {"JobState": "RUNNING", "Restarts": "0"}, INTERRUPTED),
        ("stop", {"JobState": "FAILED", "Restarts": "0"}, ENDED),  # already failed
        ("stop", {"JobState": "COMPLETING", "Restarts": "0"}, ENDED),  # failing, cleaning up
        ("stop", {"JobState": "GONE", "Restarts": "?"}, ENDED),  # purged
        ("stop", {"JobState": "PENDING", "Restarts": "1"}, REQUEUED),
        ("requeue", {"JobState": "RUNNING", "Restarts": "0"}, INTERRUPTED),
        # Slurm requeued it by itself (NODE_FAIL of a --requeue job): only an exclusion added.
        ("requeue", {"JobState": "PENDING", "Restarts": "1"}, REQUEUED),
        ("requeue", {"JobState": "NODE_FAIL", "Restarts": "0"}, ENDED),
        ("requeue", {"JobState": "RUNNING", "Restarts": "x"}, None),  # nothing to compare
        ("requeue", {}, None),  # no run read the job
        ("drain", {"gpu01": "MIXED"}, None),  # no job action
    ],
)
def test_the_effect_of_a_job_action(action: str, before: dict[str, Any], expected: str) -> None:
    assert effect(action, 0, before) == expected


def test_the_first_real_run_counts_else_the_first_dry_run() -> None:
    dry = {"dry_run": {"before": {"JobState": "RUNNING", "Restarts": "0"}}}
    later_dry = {"dry_run": {"before": {"JobState": "FAILED", "Restarts": "0"}}}
    run = {"run": {"before": {"JobState": "FAILED", "Restarts": "0"}}}
    retry = {"run": {"before": {"JobState": "PENDING", "Restarts": "1"}}}
    assert first_before([{"by": "engine"}, dry, later_dry]) == dry["dry_run"]["before"]
    assert first_before([dry, run, retry]) == run["run"]["before"]
    assert first_before([{"run": {"status": "failed"}}]) == {}
