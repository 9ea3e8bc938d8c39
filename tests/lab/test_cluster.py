"""The lab's Slurm cluster: 8 idle nodes, two partitions, two leaf switches, idempotent up."""

import pytest

from lab import manage
from lab.config import LabConfig
from lab.slurm import node_states, slurm

pytestmark = pytest.mark.lab


def test_eight_idle_nodes(lab_cfg: LabConfig) -> None:
    assert node_states(lab_cfg) == {f"gpu{i:02d}": "idle" for i in range(1, 9)}


def test_partitions(lab_cfg: LabConfig) -> None:
    out = slurm(lab_cfg, "sinfo", "-h", "-o", "%P %D %N")
    assert sorted(out.split("\n")[:-1]) == ["debug 2 gpu[07-08]", "train* 6 gpu[01-06]"]


def test_every_node_has_eight_gpus(lab_cfg: LabConfig) -> None:
    out = slurm(lab_cfg, "sinfo", "-h", "-N", "-o", "%N %G")
    assert {line.split()[1] for line in out.splitlines()} == {"gpu:8"}


def test_topology_has_two_leaf_switches(lab_cfg: LabConfig) -> None:
    out = slurm(lab_cfg, "scontrol", "show", "topology")
    assert "SwitchName=leaf1 Level=0" in out and "Nodes=gpu[01-04]" in out
    assert "SwitchName=leaf2 Level=0" in out and "Nodes=gpu[05-08]" in out


def test_up_again_changes_nothing(lab_cfg: LabConfig) -> None:
    before = {d.name: d.pid for d in manage.status(lab_cfg)}
    assert all(before.values())
    manage.up(lab_cfg)
    assert {d.name: d.pid for d in manage.status(lab_cfg)} == before
