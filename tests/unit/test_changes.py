"""What a decision changes in Slurm, from the state its playbook read and its commands."""

from __future__ import annotations

from webhook.core.changes import changes

DRAIN = 'scontrol update nodename=gpu02,gpu03 state=drain reason="slurmedic: 7.0 gpu_hardware"'


def test_a_drain_shows_each_node_before_and_after() -> None:
    run = {"commands": [DRAIN], "before": {"gpu02": "IDLE", "gpu03": "MIXED", "gpu04": "DRAIN"}}
    assert changes("drain", "slurmedic: 7.0 gpu_hardware", run) == [
        ("node gpu02", "IDLE", "DRAIN (slurmedic: 7.0 gpu_hardware)"),
        ("node gpu03", "MIXED", "DRAIN (slurmedic: 7.0 gpu_hardware)"),
        ("node gpu04", "DRAIN", "unchanged"),  # already drained: left alone
    ]


def test_a_requeue_shows_the_attempt_and_the_exclusion() -> None:
    run = {
        "commands": [
            "scontrol requeuehold 7",
            "scontrol update jobid=7 ExcNodeList=gpu01,gpu02",
            "scontrol release 7",
        ],
        "before": {"JobState": "RUNNING", "Restarts": "0", "ExcNodeList": "gpu01"},
    }
    assert changes("requeue", "", run) == [
        ("job state", "RUNNING", "PENDING (requeued: attempt 1)"),
        ("ExcNodeList", "gpu01", "gpu01,gpu02"),
    ]
    done = {"commands": [], "before": {"JobState": "RUNNING", "Restarts": "1"}}
    assert changes("requeue", "", done) == [("ExcNodeList", "(null)", "unchanged")]


def test_a_stop_and_a_run_that_read_nothing() -> None:
    assert changes("stop", "", {"commands": ["scancel 7"], "before": {"JobState": "RUNNING"}}) == [
        ("job state", "RUNNING", "CANCELLED")
    ]
    assert changes("drain", "", {"commands": [DRAIN]}) == []  # an older record: nothing shown
