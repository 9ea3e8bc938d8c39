"""What a decision would disrupt: a drain its nodes' GPUs, a requeue or stop the job's GPUs and
the GPU-hours its attempt had run; the GPUs as Slurm's gres names them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from webhook.adapters.slurm import gpu_count
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.decisions import Decision
from webhook.core.disruption import with_disruption

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:8", 8),
        ("gpu:h200:8", 8),
        ("gpu:h200:8(S:0-1)", 8),
        ("gpu:a100:4(S:0),gpu:h100:4(S:1)", 8),
        ("gpu:h100:4(S:0,1),nvme:2", 4),  # a socket list with a comma
        ("nvme:2", 0),
        ("", 0),
        ("(null)", 0),
        ("gpuish:3", 0),
    ],
)
def test_gpus_of_a_gres_string(gres: str, gpus: int) -> None:
    assert gpu_count(gres) == gpus


def view() -> ClusterView:
    v = ClusterView()
    for n in ("gpu01", "gpu02", "gpu03"):
        v.nodes[n] = Node(n, "train", "allocated", gpus=8)
    v.nodes["cpu01"] = Node("cpu01", "train", "allocated")  # no gres
    return v


def decision(action: str, **kw: object) -> Decision:
    return Decision(
        at=NOW, incident="7.0", job=7, action=action, cause="gpu_hardware", reason="", **kw
    )  # type: ignore[arg-type]


def test_a_drain_takes_its_nodes_gpus_out_of_service_without_hours() -> None:
    d = with_disruption(decision("drain", nodes=("gpu02",)), None, view(), NOW)
    assert (d.gpus, d.gpu_hours) == (8, None)


def test_a_requeue_or_stop_interrupts_every_gpu_of_the_job_for_the_hours_it_ran() -> None:
    job = Job(7, ("gpu01", "gpu02", "gpu03", "cpu01"), started=NOW - timedelta(minutes=90))
    for action in ("requeue", "stop"):
        d = with_disruption(decision(action), job, view(), NOW)
        assert (d.gpus, d.gpu_hours) == (24, 36.0)


def test_unknown_start_or_no_job_leaves_the_hours_unknown() -> None:
    d = with_disruption(decision("stop"), Job(7, ("gpu01",)), view(), NOW)
    assert (d.gpus, d.gpu_hours) == (8, None)
    assert with_disruption(decision("escalate"), None, view(), NOW) == decision("escalate")


def test_a_job_that_already_died_counts_the_hours_until_it_ended() -> None:
    job = Job(
        7,
        ("gpu01",),
        state="NODE_FAIL",
        started=NOW - timedelta(hours=3),
        ended=NOW - timedelta(hours=1),  # the decision came an hour after the death
    )
    d = with_disruption(decision("requeue"), job, view(), NOW)
    assert (d.gpus, d.gpu_hours) == (8, 16.0)
