"""What failed before (webhook/core/failures.py): a GPU's identity from any alert that names
it, the memory of application XIDs per GPU, and each node's record with the lemons first."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from webhook.core.failures import Failure, FailureMemory, gpu_of, lemons

T0 = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
WEEK = timedelta(days=7)
HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("labels", "node", "gpu"),
    [
        ({"uuid": "GPU-5e1f", "gpu": "3"}, "gpu02", "GPU-5e1f"),
        ({"UUID": "GPU-5e1f", "gpu": "3"}, "gpu02", "GPU-5e1f"),  # dcgm-exporter's own label
        ({"gpu": "3"}, "gpu02", "gpu02/3"),
        ({"gpu": "03"}, "gpu02", "gpu02/3"),
        # A job log's XID line (the kernel's spelling) and dcgm-exporter's: the same GPU.
        ({"pci_bus_id": "0000:3b:00"}, "gpu02", "gpu02/pci:3b:00"),
        ({"pci_bus_id": "00000000:3B:00.0"}, "gpu02", "gpu02/pci:3b:00"),
        ({"gpu": "x", "pci_bus_id": "nonsense"}, "gpu02", None),
        # Digits that are not ASCII: no index (int() refuses the superscript).
        ({"gpu": "\u00b2"}, "gpu02", None),
        ({"gpu": "\u0663"}, "gpu02", None),
        ({"gpu": "3"}, None, None),
        ({}, "gpu02", None),
    ],
)
def test_a_gpu_is_known_by_its_uuid_else_its_node_and_index_or_address(
    labels: dict[str, str], node: str | None, gpu: str | None
) -> None:
    assert gpu_of(labels, node) == gpu


def xid(at: datetime, node: str, gpu: str, job: int) -> Failure:
    return Failure(at=at, node=node, kind="xid:31", incident=f"{job}.0", job=job, gpu=gpu)


def drain(at: datetime, node: str, incident: str, cause: str = "gpu_hardware") -> Failure:
    return Failure(at=at, node=node, kind=cause, incident=incident)


def test_the_memory_keeps_each_failure_once_and_forgets_by_time() -> None:
    memory = FailureMemory([xid(T0, "gpu02", "GPU-a", 7)])
    assert not memory.add(xid(T0, "gpu02", "GPU-a", 7))  # fed again after a restart
    assert memory.add(xid(T0 + timedelta(hours=1), "gpu02", "GPU-a", 8))
    assert [f.job for f in memory.on_gpu("GPU-a", T0)] == [7, 8]
    assert [f.job for f in memory.on_gpu("GPU-a", T0 + timedelta(minutes=1))] == [8]
    assert memory.on_gpu("GPU-b", T0) == []
    memory.forget(T0 + timedelta(minutes=30))
    assert len(memory) == 1 and memory.add(xid(T0, "gpu02", "GPU-a", 7))


def test_lemons_first_and_a_repeat_within_the_window_is_a_suspect() -> None:
    failures = [
        # gpu05: drained twice within a week: a suspect.
        drain(T0, "gpu05", "node:gpu05"),
        drain(T0 + timedelta(days=3), "gpu05", "node:gpu05:2"),
        # gpu06: drained twice, eight days apart: not a suspect, but as many failures.
        drain(T0 - timedelta(days=9), "gpu06", "9.0"),
        drain(T0 - timedelta(days=1), "gpu06", "10.0", "degraded"),
        # gpu07: one GPU's XID 31 under two jobs: a suspect; the same job's twice is one.
        xid(T0, "gpu07", "GPU-c", 11),
        xid(T0 + timedelta(hours=1), "gpu07", "GPU-c", 11),
        xid(T0 + timedelta(hours=2), "gpu07", "GPU-c", 12),
        # gpu08: XIDs on two GPUs: not a suspect.
        xid(T0, "gpu08", "GPU-d", 13),
        xid(T0 + timedelta(hours=1), "gpu08", "GPU-e", 14),
    ]
    records = lemons(failures, WEEK, 2)
    assert [(r.node, r.failures, r.suspect) for r in records] == [
        ("gpu07", 3, True),
        ("gpu05", 2, True),
        ("gpu08", 2, False),
        ("gpu06", 2, False),
    ]
    gpu07, gpu05, _, gpu06 = records
    assert (gpu07.drains, gpu07.app_xids, gpu07.gpus, gpu07.jobs) == (0, 3, ("GPU-c",), 2)
    assert gpu06.causes == ("degraded", "gpu_hardware") and gpu06.drains == 2
    assert (gpu05.first, gpu05.last) == (T0, T0 + timedelta(days=3))
    # A count of 3 makes none of them a suspect.
    assert not any(r.suspect for r in lemons(failures, WEEK, 3))


def test_a_drain_left_in_service_and_its_fault_alerting_again_are_one_failure() -> None:
    # One fault alerting twice (XID 79, then the GPU gone under the next job 20 minutes on).
    # Monitor mode's drain left the node in service.
    failures = [
        replace(drain(T0, "gpu05", "9.0"), ran=False),
        drain(T0 + timedelta(minutes=20), "gpu05", "10.0"),
    ]
    assert [r.suspect for r in lemons(failures, WEEK, 2, HOUR)] == [False]
    assert [r.suspect for r in lemons(failures, WEEK, 2)] == [True]
    # Counted all the same: two drains.
    assert lemons(failures, WEEK, 2, HOUR)[0].drains == 2
    # Back a day later: a repeat.
    again = [*failures, drain(T0 + timedelta(days=1), "gpu05", "11.0")]
    assert [r.suspect for r in lemons(again, WEEK, 2, HOUR)] == [True]
    # A drain that ran took it out of service: failing 20 minutes after it was resumed is a
    # repeat.
    ran = [drain(T0, "gpu05", "9.0"), drain(T0 + timedelta(minutes=20), "gpu05", "10.0")]
    assert [r.suspect for r in lemons(ran, WEEK, 2, HOUR)] == [True]


def test_the_cluster_s_rate_is_learned_from_a_long_enough_record() -> None:
    from webhook.core.failures import LEARN_AFTER, LEARN_FROM, learned_rate

    # 2,048 nodes, 90 days, 700 failures: 3.8 per 1,000 node-days (Llama 3's fleet).
    assert learned_rate(700, 2048, timedelta(days=90)) == pytest.approx(3.8, abs=0.01)
    assert learned_rate(LEARN_FROM - 1, 2048, timedelta(days=90)) is None  # too thin
    assert learned_rate(700, 2048, LEARN_AFTER - timedelta(hours=1)) is None  # too short
    assert learned_rate(700, 0, timedelta(days=90)) is None


def test_a_learned_rate_replaces_the_default_but_not_a_rate_the_policy_sets() -> None:
    from webhook.core.cluster import ClusterView
    from webhook.core.engine import Engine
    from webhook.core.policy import load_policy

    engine = Engine(view=ClusterView(), policy=load_policy({"settle_seconds": 5}))
    engine.learn_failure_rate(None)
    assert engine.policy.failure_rate == 3.8
    engine.learn_failure_rate(9.0)
    assert engine.policy.failure_rate == 9.0 and engine.policy.settle_seconds == 5
    engine.learn_failure_rate(7.0)  # learned again: from the operator's policy, not the last
    assert engine.policy.failure_rate == 7.0
    set_by_hand = Engine(view=ClusterView(), policy=load_policy({"failure_rate": 2.0}))
    set_by_hand.learn_failure_rate(9.0)
    assert set_by_hand.policy.failure_rate == 2.0
