"""The playbook runs' cgroup (executor.cpu_weight), on this machine's real cgroups: a real
`drain_nodes` run through ansible-runner, whose stand-in `scontrol` (started by the run's module,
three processes down) writes down the cgroup it finds itself in.

This machine's kernel has the cpu controller on cgroup v1 (/sys/fs/cgroup/cpu) and a cgroup v2
hierarchy without it (/sys/fs/cgroup/unified), which keeps it even with v1's hierarchy
unmounted: v1 is tested running, v2 refusing on the real hierarchy, and what slurmedic writes on
v2 is tested on a stand-in tree of plain files (the kernel's part, moving a process when its pid
is written, is not in it)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.service.conftest import stand_in
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
    stand_in(tmp_path, monkeypatch, "scontrol", SCONTROL.format(log=log))
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


@pytest.mark.parametrize(("weight", "shares"), [(1, "10"), (20, "204"), (100, "1024")])
def test_the_weight_scales_to_v1_shares(weight: int, shares: str) -> None:
    name = f"slurmedic-test-{os.getpid()}"  # not the group running loops share
    group = cgroup.prepare(weight, v1_name=name)
    try:
        own = cgroup.own_cgroup(Path("/proc/self/cgroup").read_text(), "cpu")
        assert own is not None
        assert group.procs.parent == cgroup.CGROUP_ROOT / "cpu" / own.lstrip("/") / name
        assert (group.procs.parent / "cpu.shares").read_text().strip() == shares
    finally:
        group.procs.parent.rmdir()


def test_own_cgroup_reads_each_version_and_controller_by_name() -> None:
    text = "12:cpuacct:/acct\n4:cpu,cpuset:/svc/a\n0::/system.slice/slurmedic.service\n"
    assert cgroup.own_cgroup(text, "cpu") == "/svc/a"  # not cpuacct's, whose name holds "cpu"
    assert cgroup.own_cgroup(text, None) == "/system.slice/slurmedic.service"
    assert cgroup.own_cgroup("4:memory:/m\n", "cpu") is None


def test_v2_refuses_the_hosts_root_and_a_cgroup_without_cpu_on_the_real_hierarchy() -> None:
    unified = Path("/sys/fs/cgroup/unified")
    assert "cpu" not in (unified / "cgroup.controllers").read_text().split()
    with pytest.raises(cgroup.Unavailable, match="is a root cgroup"):
        cgroup.prepare(20, root=unified)  # this process is in its root
    child = unified / f"slurmedic-test-{os.getpid()}"  # a real cgroup: the kernel's files
    child.mkdir()
    try:
        with pytest.raises(cgroup.Unavailable, match=r"no cpu controller.*Delegate=cpu"):
            cgroup.prepare(20, root=unified, self_cgroup=f"0::/{child.name}\n")
        assert not (child / "runs").exists() and not (child / "service").exists()
    finally:
        child.rmdir()
    assert not (unified / "runs").exists()


def test_no_cgroup_to_write_is_refused_not_raised(tmp_path: Path) -> None:
    with pytest.raises(cgroup.Unavailable, match="no cpu controller"):
        cgroup.prepare(20, root=tmp_path)
    (tmp_path / "cpu").write_text("")  # a file where the hierarchy should be: an OSError
    with pytest.raises(cgroup.Unavailable):
        cgroup.prepare(20, root=tmp_path, self_cgroup="1:cpu:/x\n")


UNIT = "system.slice/slurmedic.service"


def v2_tree(tmp_path: Path, *, procs: list[int], mark: bool = True) -> Path:
    """A stand-in cgroup v2 tree: the host's root and a service's cgroup holding `procs`."""
    root = tmp_path / "cgroup"
    unit = root / UNIT
    unit.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for d in (root / "system.slice", unit):
        (d / "cgroup.type").write_text("domain\n")
        (d / "cgroup.controllers").write_text("cpu memory pids\n")
        (d / "cgroup.subtree_control").write_text("")
    (unit / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
    if mark:
        os.setxattr(unit, "trusted.delegate", b"1")  # as systemd marks Delegate=
    return root


def test_v2_moves_serve_to_a_leaf_and_weights_the_runs(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, procs=[os.getpid()])
    group = cgroup.prepare(20, root=root, self_cgroup=f"0::/{UNIT}\n")
    unit = root / UNIT
    assert group == cgroup.RunGroup(unit / "runs" / "cgroup.procs", 20)
    assert (unit / "service" / "cgroup.procs").read_text() == str(os.getpid())
    assert (unit / "cgroup.subtree_control").read_text() == "+cpu"
    assert (unit / "runs" / "cpu.weight").read_text() == "20"


def test_v2_started_again_in_its_leaf_does_not_nest(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, procs=[])
    unit = root / UNIT
    (unit / "runs").mkdir()
    (unit / "service").mkdir()
    (unit / "service" / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (unit / "cgroup.subtree_control").write_text("cpu\n")
    group = cgroup.prepare(20, root=root, self_cgroup=f"0::/{UNIT}/service\n")
    assert group.procs == unit / "runs" / "cgroup.procs"
    assert not (unit / "service" / "service").exists()
    assert (unit / "cgroup.subtree_control").read_text() == "cpu\n"  # on already: not written


@pytest.mark.parametrize(
    ("procs", "mark", "cgroup_line", "refusal"),
    [
        ([os.getpid(), 1], True, f"0::/{UNIT}", "holds other processes \\(1\\)"),
        ([os.getpid()], False, f"0::/{UNIT}", "not marked delegated"),
        ([os.getpid()], True, "0::/", "is a root cgroup"),  # the host's: no cgroup.type
    ],
)
def test_v2_refuses_what_is_not_its_own(
    tmp_path: Path, procs: list[int], mark: bool, cgroup_line: str, refusal: str
) -> None:
    root = v2_tree(tmp_path, procs=procs, mark=mark)
    with pytest.raises(cgroup.Unavailable, match=refusal):
        cgroup.prepare(20, root=root, self_cgroup=cgroup_line + "\n")
    assert not (root / UNIT / "service").exists()
    assert not (root / "runs").exists() and not (root / UNIT / "runs").exists()
    assert (root / UNIT / "cgroup.subtree_control").read_text() == ""


def test_a_containers_namespace_root_is_not_divided(tmp_path: Path) -> None:
    # Inside a cgroup namespace the container's cgroup reads as "/" and has a cgroup.type.
    root = v2_tree(tmp_path, procs=[os.getpid()])
    (root / "cgroup.type").write_text("domain\n")
    (root / "cgroup.procs").write_text(f"{os.getpid()}\n")
    os.setxattr(root, "trusted.delegate", b"1")
    with pytest.raises(cgroup.Unavailable, match="is a root cgroup"):
        cgroup.prepare(20, root=root, self_cgroup="0::/\n")
    assert not (root / "service").exists() and not (root / "runs").exists()


@pytest.mark.parametrize("mark", [*cgroup.DELEGATE_MARKS, None])
def test_only_systemds_mark_says_delegated(tmp_path: Path, mark: str | None) -> None:
    unit = tmp_path / "unit"
    unit.mkdir()
    os.chown(unit, 1000, 1000)  # owned by a service's user: under a user's systemd, every one is
    if mark is not None:
        os.setxattr(unit, mark, b"1")
    assert cgroup.delegated(unit) == (mark is not None)


def test_the_group_handed_to_the_loop_reads_back() -> None:
    group = cgroup.RunGroup(Path("/sys/fs/cgroup/cpu/slurmedic-runs/cgroup.procs"), 20)
    assert cgroup.RunGroup.from_env(group.env()) == group
    assert cgroup.RunGroup.from_env("") is None  # serve's "none": the loop makes none either


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
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")  # ENOTDIR, as any other error joining: still runs
    out = subprocess.run(
        [*cgroup.command(cgroup.RunGroup(not_a_dir / "cgroup.procs", 20)), "/bin/echo", "ran"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "ran\n"


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
def test_serve_prepares_its_runs_group_once(tmp_path: Path, weight: int | None) -> None:
    """serve prepares the group before it starts anything; its loop, started again after a
    `kill -9`, is handed the same group and prepares none of its own (each loop says which it
    has: a loop the keeper forks has serve's environment, not one /proc shows)."""
    from lab.processes import is_alive
    from tests.lab.conftest import eventually
    from tests.local_server import serve_children, start_server, stop_server

    group = cgroup.CGROUP_ROOT / "cpu" / cgroup.V1_NAME
    server = start_server(tmp_path, executor={"cpu_weight": weight})
    try:
        (loop,) = serve_children(server.proc.pid, loop=True)
        os.kill(loop, signal.SIGKILL)
        eventually(lambda: not is_alive(loop), timeout=60, what="the loop to die")
        eventually(
            lambda: [p for p in serve_children(server.proc.pid, loop=True) if p != loop],
            timeout=60,
            what="a new loop",
        )
        # The new loop has said which group it has (anything it made, it made before).
        handed = f"in serve's group {group} (weight 20)" if weight else "unweighted, as serve's"
        log = eventually(
            lambda: (
                (out := (tmp_path / "serve.out").read_text()).count(
                    f"the loop's playbook runs: {handed}"
                )
                == 2
                and out
            ),
            timeout=60,
            what="the second loop's group",
        )
    finally:
        stop_server(server.proc)
    said = f"playbook runs: CPU weight 20, in {group}"
    assert log.count(said) == (1 if weight is not None else 0), log
    assert "not weighted" not in log, log
