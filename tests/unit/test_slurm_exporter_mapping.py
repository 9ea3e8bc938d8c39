"""sinfo --json fields map to the StateLong strings and state buckets SckyzO's exporter uses."""

import pytest

from lab.slurm_exporter import gres_count, state_bucket, state_long


@pytest.mark.parametrize(
    ("state", "flags", "long", "bucket"),
    [
        ("idle", [], "idle", "idle"),
        ("allocated", [], "allocated", "alloc"),
        ("mixed", [], "mixed", "mix"),
        ("idle", ["DRAIN"], "drained", "drain"),
        ("allocated", ["DRAIN"], "draining", "drain"),
        ("down", ["NOT_RESPONDING"], "down*", "down"),
        ("allocated", ["NOT_RESPONDING"], "allocated*", "alloc"),
        ("down", ["DRAIN"], "down", "down"),
        ("idle", ["COMPLETING"], "completing", "comp"),
        ("future", [], "future", "other"),
    ],
)
def test_state_long_and_bucket(state: str, flags: list[str], long: str, bucket: str) -> None:
    node = {"state": state, "state_flags": flags}
    assert state_long(node) == long
    assert state_bucket(node) == bucket


@pytest.mark.parametrize(
    ("gres", "n"),
    [
        ("gpu:8", 8),
        ("gpu:h200:8(IDX:0-7)", 8),
        ("gpu:0", 0),
        ("", 0),
        ("N/A", 0),
        ("gpu:a:2,gpu:b:3", 5),
        ("nic:4", 0),
    ],
)
def test_gres_count(gres: str, n: int) -> None:
    assert gres_count(gres) == n
