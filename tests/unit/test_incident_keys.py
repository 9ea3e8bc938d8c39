"""Incident keys: one encoding, read back the same, and always a drain reason Slurm accepts."""

from __future__ import annotations

import pytest

from webhook.core.incidents import MAX_LEN, BadIncidentKey, IncidentKey, attempt_of
from webhook.executor.runner import DrainVars

KEYS = [
    (IncidentKey.of_attempt(1001, 0), "1001.0"),
    (IncidentKey.of_attempt(9_999_999_999, 123_456), "9999999999.123456"),
    (IncidentKey.of_node("gpu02"), "node:gpu02"),
    (IncidentKey.of_node("gpu02", 2), "node:gpu02:2"),
    (IncidentKey.of_node("rack1-node.07_a", 17), "node:rack1-node.07_a:17"),
    (IncidentKey.verifying(1001, 3), "verify:1001.3"),
    (IncidentKey.resuming(("gpu02", "gpu01", "gpu03")), "resume:gpu[01-03]"),
]


@pytest.mark.parametrize(("key", "text"), KEYS, ids=[t for _, t in KEYS])
def test_a_key_encodes_and_decodes_to_itself(key: IncidentKey, text: str) -> None:
    assert str(key) == text
    assert IncidentKey.parse(text) == key
    assert str(IncidentKey.parse(text)) == text


@pytest.mark.parametrize(("key", "text"), KEYS[:6], ids=[t for _, t in KEYS[:6]])
def test_every_key_makes_a_drain_reason_the_playbook_accepts(key: IncidentKey, text: str) -> None:
    DrainVars(slurmedic_nodes=["gpu02"], slurmedic_reason=f"slurmedic: {key} gpu_hardware")


def test_a_node_s_next_failure_counts_up() -> None:
    first = IncidentKey.of_node("gpu02")
    assert str(first.next_failure()) == "node:gpu02:2"
    assert str(first.next_failure().next_failure()) == "node:gpu02:3"


def test_keys_of_older_ledgers_are_read() -> None:
    assert IncidentKey.parse("node:gpu02#2") == IncidentKey.of_node("gpu02", 2)


def test_the_attempt_of_a_key() -> None:
    assert attempt_of("1001.4") == 4
    assert attempt_of("verify:1001.2") == 2
    assert attempt_of("node:gpu02:3") == 0


def test_a_long_resume_list_keeps_its_key_short() -> None:
    nodes = tuple(f"n{i}x{i * 7}" for i in range(40))
    text = str(IncidentKey.resuming(nodes))
    assert len(text) <= MAX_LEN and text.startswith("resume:")
    assert IncidentKey.parse(text).nodes[0] == sorted(nodes)[0]


@pytest.mark.parametrize(
    "text",
    ["", "1001", "1001.x", "node:", "node:-bad", "node:gpu02:x", "verify:node:gpu02", "job;rm -rf"],
)
def test_what_is_not_a_key_is_refused(text: str) -> None:
    with pytest.raises(BadIncidentKey):
        IncidentKey.parse(text)
