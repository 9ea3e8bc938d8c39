"""Lab configuration: ports never collide, Slurm files say what lab.md says works."""

from pathlib import Path

import pytest

from lab.config import LabConfig
from lab.slurm import render_gres_conf, render_slurm_conf, render_topology_conf


@pytest.fixture
def cfg(tmp_path: Path) -> LabConfig:
    return LabConfig(run_dir=tmp_path, port_base=27000)


def test_every_port_is_distinct(cfg: LabConfig) -> None:
    ports = [
        cfg.slurmctld_port,
        cfg.prometheus_port,
        cfg.pushgateway_port,
        cfg.alertmanager_port,
        cfg.mtail_port,
        cfg.slurm_exporter_port,
        cfg.receiver_port,
    ]
    ports += [cfg.slurmd_port(n) for n in cfg.nodes] + [cfg.dcgm_port(n) for n in cfg.nodes]
    assert len(ports) == len(set(ports)) == 7 + 16
    assert all(27000 < p < 28000 for p in ports)


def test_slurm_conf(cfg: LabConfig) -> None:
    conf = render_slurm_conf(cfg)
    assert "Port=[27001-27008]" in conf
    assert "NodeName=gpu[01-08]" in conf and "Gres=gpu:8" in conf
    assert "PartitionName=train Nodes=gpu[01-06] Default=YES" in conf
    assert "PartitionName=debug Nodes=gpu[07-08] Default=NO" in conf
    assert f"AuthInfo=socket={cfg.munge_socket},cred_expire=5" in conf
    assert "SlurmdSpoolDir=" in conf and "%n" in conf


def test_gres_uses_device_files(cfg: LabConfig) -> None:
    assert "AutoDetect=off" in render_gres_conf(cfg)
    assert f"File={cfg.run_dir}/dev/nvidia[0-7]" in render_gres_conf(cfg)


def test_topology_has_two_leaves(cfg: LabConfig) -> None:
    topo = render_topology_conf(cfg)
    assert "SwitchName=leaf1 Nodes=gpu[01-04]" in topo
    assert "SwitchName=leaf2 Nodes=gpu[05-08]" in topo
    assert "SwitchName=spine Switches=leaf[1-2]" in topo


def test_partition_of(cfg: LabConfig) -> None:
    assert cfg.partition_of("gpu06") == "train"
    assert cfg.partition_of("gpu07") == "debug"


def test_host_label_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMEDIC_LAB_DCGM_HOST_LABEL", "host")
    with pytest.raises(ValueError, match="Hostname or hostname"):
        LabConfig.from_env()
    monkeypatch.setenv("SLURMEDIC_LAB_DCGM_HOST_LABEL", "hostname")
    assert LabConfig.from_env().dcgm_host_label == "hostname"


@pytest.mark.parametrize("base", ["40000", "80", "lots"])
def test_port_base_stays_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch, base: str
) -> None:
    monkeypatch.setenv("SLURMEDIC_LAB_PORT_BASE", base)
    with pytest.raises(ValueError, match="from 1024 to 31000"):
        LabConfig.from_env()
