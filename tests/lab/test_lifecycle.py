"""A lab of its own: up twice is harmless, the new host label style, down leaves nothing."""

import socket
from pathlib import Path

import pytest

from lab import manage, processes
from lab.config import LabConfig
from tests.lab.conftest import TEST_PORT_BASE, eventually, running_nodes, scrape

pytestmark = pytest.mark.lab


def test_up_up_down_leaves_nothing_running(tmp_path: Path) -> None:
    cfg = LabConfig(
        run_dir=tmp_path / "lab", port_base=TEST_PORT_BASE + 1000, dcgm_host_label="hostname"
    )
    try:
        manage.up(cfg)
        daemons = {d.name: d.pid for d in manage.status(cfg)}
        pids = manage.running(cfg)
        assert len(pids) >= 17  # munged, slurmctld, 8 slurmd, 6 monitoring processes (+ children)
        manage.up(cfg)
        # The same daemons; any other lab process is one of theirs (a Slurm command an exporter
        # runs, which takes longer through a stack's wrapper), never a second copy of a daemon.
        assert {d.name: d.pid for d in manage.status(cfg)} == daemons
        roots = {pid for pid in daemons.values() if pid is not None}
        extra = set(manage.running(cfg)) - set(pids)
        below = {p for root in roots for p in processes.descendants(root)}
        assert not {p for p in extra if processes.is_alive(p) and p not in below}

        # The dcgm-exporter release after mid-2026 says `hostname`.
        labels = [
            lb
            for lb, _ in scrape(f"{cfg.url(cfg.dcgm_port('gpu02'))}/metrics")[
                "DCGM_FI_DEV_GPU_TEMP"
            ]
        ]
        assert labels and all(lb["hostname"] == "gpu02" and "Hostname" not in lb for lb in labels)

        job = manage.submit_training(cfg, nodes=2, step_time=0.2)
        running_nodes(cfg, job)
        eventually(lambda: list(cfg.joblogs.glob(f"slurm-{job}-*.out")), what="job tasks started")
    finally:
        manage.down(cfg)
    assert manage.running(cfg) == []
    assert list(processes.marked_pids(cfg)) == []
    for p in (
        cfg.slurmctld_port,
        cfg.prometheus_port,
        cfg.dcgm_port("gpu01"),
        cfg.slurmd_port("gpu08"),
        cfg.slurmdbd_port,
        cfg.mariadb_port,
    ):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", p)) != 0, f"port {p} still open"


def test_a_taken_port_is_named(tmp_path: Path) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab", port_base=TEST_PORT_BASE + 2000)
    with socket.socket() as s:
        s.bind(("127.0.0.1", cfg.prometheus_port))
        s.listen()
        with pytest.raises(Exception, match=f"port {cfg.prometheus_port} for prometheus is in use"):
            manage.up(cfg)
    manage.down(cfg)
    assert manage.running(cfg) == []
