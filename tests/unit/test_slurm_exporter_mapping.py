"""Node states of every release's JSON map to the StateLong strings and state buckets SckyzO's
exporter uses: 22.05 (`"state": "idle"`, `"state_flags": [...]`) and 23.02+ (`["IDLE", ...]`)."""

import pytest

from lab.slurm_exporter import gres_count, state_bucket
from webhook.adapters.slurm import Release, read_nodes


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
        ("down", ["DRAIN"], "drained", "drain"),  # Slurm: drain wins over down
        ("down", ["DRAIN", "NOT_RESPONDING"], "drained*", "drain"),
        ("idle", ["DRAIN", "COMPLETING"], "draining", "drain"),
        ("allocated", ["COMPLETING"], "allocated+", "alloc"),
        ("idle", ["FAIL"], "fail", "fail"),
        ("mixed", ["FAIL"], "failing", "fail"),
        ("idle", ["INVALID_REG"], "inval", "inval"),
        ("idle", ["MAINTENANCE"], "maint", "maint"),
        ("idle", ["PLANNED"], "planned", "planned"),
        ("idle", ["COMPLETING"], "completing", "comp"),
        ("future", [], "future", "other"),
    ],
)
def test_state_long_and_bucket(state: str, flags: list[str], long: str, bucket: str) -> None:
    old = {"name": "n1", "state": state, "state_flags": flags}
    new = {"name": "n1", "state": [state.upper(), *flags]}
    for raw, release in ((old, Release(22, 5, 8)), (new, Release(24, 11, 5))):
        (node,) = read_nodes({"nodes": [raw]}, release, ("scontrol",))
        assert node.state_long == long
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
