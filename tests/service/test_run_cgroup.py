"""The playbook runs' cgroup (executor.cpu_weight), on this machine's real cgroups: a real
`drain_nodes` run through ansible-runner, whose stand-in `scontrol` (started by the run's module,
three processes down) writes down the cgroup it finds itself in.

This machine's kernel has the cpu controller on cgroup v1 (/sys/fs/cgroup/cpu) and a cgroup v2
hierarchy without it (/sys/fs/cgroup/unified): v1 is tested running, v2 refusing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from webhook.executor import cgroup
from webhook.executor.runner import run_playbook

SCONTROL = """#!/bin/sh
grep -E '^[0-9]+:[^:]*cpu[,:]' /proc/$$/cgroup >> "{log}"
case "$1 $2" in
  "show node") echo "NodeName=$3 State=ALLOCATED Reason=(null)";;
esac
"""
DRAIN = {"slurmedic_nodes": ["gpu01"], "slurmedic_reason": "slurmedic: 7.0 gpu_hardware"}


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "cgroups.log"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(SCONTROL.format(log=log))
    fake.chmod(0o755)
    bin_dirs = (fake.parent, Path(sys.executable).parent, os.environ["PATH"])
    monkeypatch.setenv("PATH", os.pathsep.join(map(str, bin_dirs)))
    return log


def test_a_run_and_what_it_starts_are_in_the_runs_cgroup(scontrol: Path) -> None:
    group = cgroup.prepare(20)
    assert group.procs.name == "cgroup.procs"
    assert (group.procs.parent / "cpu.shares").read_text().strip() == "204"  # 20 % of 1024
    where = f"/{group.procs.parent.relative_to(cgroup.CGROUP_ROOT / 'cpu')}"

    weighted = run_playbook("drain_nodes", DRAIN, check=True, group=group)
    assert weighted.ok, weighted.output
    seen = scontrol.read_text().splitlines()
    assert seen and all(line.split(":", 2)[2] == where for line in seen), seen

    scontrol.write_text("")
    plain = run_playbook("drain_nodes", DRAIN, check=True)
    assert plain.ok, plain.output
    assert plain.commands == weighted.commands  # the same run, only where it ran differs
    seen = scontrol.read_text().splitlines()
    assert seen and not any(line.split(":", 2)[2] == where for line in seen), seen


def test_the_weight_scales_to_v1_shares() -> None:
    low = cgroup.prepare(1)
    assert (low.procs.parent / "cpu.shares").read_text().strip() == "10"
    even = cgroup.prepare(100)
    assert (even.procs.parent / "cpu.shares").read_text().strip() == "1024"
    cgroup.prepare(20)  # as the other tests and a running loop leave it


def test_v2_without_the_cpu_controller_is_refused_by_name() -> None:
    unified = Path("/sys/fs/cgroup/unified")
    assert "cpu" not in (unified / "cgroup.controllers").read_text().split()
    with pytest.raises(cgroup.Unavailable, match=r"no cpu controller.*Delegate=cpu"):
        cgroup.prepare(20, root=unified)
    assert not (unified / "runs").exists()


def test_no_cgroup_to_write_is_refused_not_raised(tmp_path: Path) -> None:
    with pytest.raises(cgroup.Unavailable, match="no cpu controller"):
        cgroup.prepare(20, root=tmp_path)


def test_a_run_whose_cgroup_is_gone_still_runs_unweighted(tmp_path: Path) -> None:
    gone = tmp_path / "removed" / "cgroup.procs"
    out = subprocess.run(
        [*cgroup.command(cgroup.RunGroup(gone, 20)), "/bin/echo", "ran"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "ran\n"
    assert "running unweighted" in out.stderr


def test_without_a_group_nothing_is_put_before_the_command() -> None:
    assert cgroup.command(None) == []


def test_the_dispatcher_runs_its_playbooks_in_its_group(scontrol: Path, tmp_path: Path) -> None:
    from webhook.executor.dispatch import Dispatcher
    from webhook.ledger.store import Ledger

    group = cgroup.prepare(20)
    where = f"/{group.procs.parent.relative_to(cgroup.CGROUP_ROOT / 'cpu')}"
    dispatcher = Dispatcher(Ledger(f"sqlite:///{tmp_path / 'ledger.db'}"), group=group)
    assert dispatcher._run("drain_nodes", DRAIN, check=True).ok
    seen = scontrol.read_text().splitlines()
    assert seen and all(line.split(":", 2)[2] == where for line in seen), seen


@pytest.mark.parametrize("weight", [20, None])
def test_serve_says_where_its_runs_go(tmp_path: Path, weight: int | None) -> None:
    from tests.local_server import start_server, stop_server

    server = start_server(tmp_path, executor={"cpu_weight": weight})
    try:
        log = (tmp_path / "serve.out").read_text()
    finally:
        stop_server(server.proc)
    said = f"playbook runs: CPU weight 20, in {cgroup.CGROUP_ROOT / 'cpu' / cgroup.V1_NAME}"
    assert (said in log) == (weight is not None), log
    assert "not weighted" not in log, log
