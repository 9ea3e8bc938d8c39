"""Lab configuration: ports never collide, Slurm files say what lab.md says works."""

from pathlib import Path

import pytest

from lab.accounting import render_slurmdbd_conf
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
        cfg.mariadb_port,
        cfg.slurmdbd_port,
        cfg.postgres_port,
        cfg.alertmanager_gossip_port,
        cfg.alertmanager_peer_port,
        cfg.alertmanager_peer_gossip_port,
    ]
    ports += [cfg.slurmd_port(n) for n in cfg.nodes] + [cfg.dcgm_port(n) for n in cfg.nodes]
    # The replica tests' slurmedic replicas take the receiver's port and the next two.
    ports += [cfg.receiver_port + 1, cfg.receiver_port + 2]
    # `lab shards split`: a Prometheus per leaf switch.
    ports += [cfg.prometheus_shard_port(s.name) for s in cfg.switches]
    assert len(ports) == len(set(ports)) == 13 + 16 + 2 + 2
    assert all(27000 < p < 28000 for p in ports)


def test_slurm_conf(cfg: LabConfig) -> None:
    conf = render_slurm_conf(cfg)
    assert "Port=[27001-27008]" in conf
    assert "NodeName=gpu[01-08]" in conf and "Gres=gpu:8" in conf
    assert "PartitionName=train Nodes=gpu[01-06] Default=YES" in conf
    assert "PartitionName=debug Nodes=gpu[07-08] Default=NO" in conf
    assert f"AuthInfo=socket={cfg.munge_socket},cred_expire=5" in conf
    assert "SlurmdSpoolDir=" in conf and "%n" in conf


def test_accounting_is_on_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SLURMEDIC_LAB_ACCOUNTING", raising=False)
    cfg = LabConfig(run_dir=tmp_path, port_base=27000)
    conf = render_slurm_conf(cfg)
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert f"AccountingStoragePort={cfg.slurmdbd_port}" in conf
    assert f"AccountingStoragePass={cfg.munge_socket}" in conf
    assert "AccountingStorageTRES=gres/gpu" in conf


def test_slurmdbd_conf(cfg: LabConfig) -> None:
    conf = render_slurmdbd_conf(cfg, "secret")
    assert f"DbdPort={cfg.slurmdbd_port}" in conf and f"StoragePort={cfg.mariadb_port}" in conf
    assert "StorageHost=127.0.0.1" in conf and "StoragePass=secret" in conf
    assert f"AuthInfo=socket={cfg.munge_socket}" in conf
    assert f"PidFile={cfg.run_dir}/" in conf and f"LogFile={cfg.logs}/" in conf


def test_accounting_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURMEDIC_LAB_ACCOUNTING", "0")
    cfg = LabConfig.from_env(tmp_path)
    assert not cfg.accounting and cfg.env()["SLURMEDIC_LAB_ACCOUNTING"] == "0"
    assert "AccountingStorageType=accounting_storage/none" in render_slurm_conf(cfg)
    monkeypatch.setenv("SLURMEDIC_LAB_ACCOUNTING", "no")
    with pytest.raises(ValueError, match="SLURMEDIC_LAB_ACCOUNTING must be 1"):
        LabConfig.from_env(tmp_path)


def test_accounting_follows_the_run_dirs_lab(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Unset, the setting the lab in the run directory was brought up with."""
    monkeypatch.delenv("SLURMEDIC_LAB_ACCOUNTING", raising=False)
    assert LabConfig.from_env(tmp_path).accounting
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "accounting").write_text("0\n")
    assert not LabConfig.from_env(tmp_path).accounting


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


def test_the_lab_ruler_federates_the_shards_under_the_job_the_rules_select() -> None:
    """SlurmedicShardDown watches `up{shard_selector}`: the lab's federation job must be it."""
    from lab.monitoring import SHARD_JOB
    from webhook.rules.render import RuleSource

    assert RuleSource().config("global")["shard_selector"] == f'job="{SHARD_JOB}"'


def test_the_lab_s_slurmedic_reaches_slurm_through_slurmrestd_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SLURMEDIC_LAB_SLURM=rest: the lab's slurmedic config names slurmrestd alone (no Slurm
    config or commands), with the token `up` makes; a config slurmedic itself accepts."""
    from lab.monitoring import cluster_config
    from webhook.service.config import Cluster

    monkeypatch.setenv("SLURMEDIC_LAB_SLURM", "rest")
    cfg = LabConfig(run_dir=tmp_path, port_base=27000)
    rest = cluster_config(cfg)
    assert rest["slurm"] == "rest" and "slurm_conf" not in rest and "slurm_bin" not in rest
    assert rest["rest"]["token_file"] == str(cfg.slurmrestd_token_file)
    assert rest["rest"]["url"] == cfg.slurmrestd_url
    Cluster.model_validate(rest)
    assert cluster_config(cfg, "cli")["slurm_conf"] == str(cfg.slurm_conf)
    monkeypatch.setenv("SLURMEDIC_LAB_SLURM", "scontrol")
    with pytest.raises(ValueError, match=r"SLURMEDIC_LAB_SLURM must be cli .* or rest"):
        LabConfig(run_dir=tmp_path, port_base=27000)
