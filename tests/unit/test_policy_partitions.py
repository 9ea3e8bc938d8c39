"""A partition's own settings in the policy: its modes and its retry budget (the keys it gives,
the policy's for the rest); the breaker stays the whole cluster's, and saying it per
partition is an error that says why."""

from __future__ import annotations

from datetime import timedelta

import pytest

from webhook.core.policy import PolicyError, load_policy


def test_a_partition_s_retry_budget_overrides_only_the_keys_it_gives() -> None:
    policy = load_policy(
        {
            "retry_budget": {"max_requeues": 5, "window": "12h"},
            "partitions": {"canary": {"retry_budget": {"max_requeues": 1}}, "train": {}},
        }
    )
    canary = policy.budget_for("canary")
    assert (canary.max_requeues, canary.window) == (1, timedelta(hours=12))
    assert policy.budget_for("train") == policy.retry_budget
    assert policy.budget_for(None) == policy.retry_budget
    assert policy.hardware_requeues(4, canary) == 1  # 4 nodes expect far less than one failure


def test_a_partition_s_budget_window_is_a_window_the_engine_remembers() -> None:
    policy = load_policy({"partitions": {"long": {"retry_budget": {"window": "3d"}}}})
    assert policy.retention_age == timedelta(days=3)
    with pytest.raises(PolicyError, match=r"shorter than partitions\.long\.retry_budget\.window"):
        load_policy({"retention": "1d", "partitions": {"long": {"retry_budget": {"window": "3d"}}}})


def test_the_breaker_per_partition_is_refused_saying_why() -> None:
    with pytest.raises(PolicyError) as e:
        load_policy({"partitions": {"canary": {"breaker": {"max_fraction": 0.5}}}})
    assert str(e.value) == (
        "partitions.canary: breaker: the breaker is the whole cluster's (it bounds the drains of "
        "every partition together, as a storm crosses them); set it at the top of the policy"
    )
