"""The playbook runs' share of the CPU: a cgroup of their own, weighted below the service's.

A storm brings alerts and playbook runs at once. On a small controller the runs (each an
`ansible-playbook` and its modules' Python processes, 1.5-2.5 CPU seconds) take the CPU from the
webhook while Alertmanager waits for its answers, and a late answer is a re-delivery. In a
cgroup with a lower CPU weight, the runs give way to the webhook when the CPU is short, and take
all of it when it is not: a weight is a share under contention, not a limit.

A nice value does not do this: ansible-runner starts each run in a session of its own, and
Ansible each task's worker (setsid). Where the kernel groups CPU time by session (autogroups,
in force for processes outside a CPU cgroup) a nice value counts only within its session.

- cgroup v2 (systemd's hosts): the service's cgroup needs the cpu controller, which systemd
  gives with `Delegate=cpu` (or `Delegate=yes`). v2 lets processes live only in leaves: the
  service's processes move to a leaf `service`, the runs go to a leaf `runs`.
- cgroup v1: a child `slurmedic-runs` of the service's cpu cgroup, `cpu.shares` in proportion.
- Neither (not root, no delegation): the runs are not weighted, and the loop says so once.

A run joins its cgroup itself, before it becomes `ansible-playbook` (`python -m
webhook.executor.cgroup PROCS COMMAND...`), so that every process it starts is in it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_SHARES = 1024  # v1's default cpu.shares, v2's default cpu.weight is 100
V1_NAME = "slurmedic-runs"


class Unavailable(Exception):
    """No cgroup for the runs here: the reason, for the log."""


@dataclass(frozen=True)
class RunGroup:
    procs: Path  # the cgroup.procs a run writes its pid into
    weight: int  # in cgroup v2's terms (default 100)


def own_cgroup(text: str, controller: str | None) -> str | None:
    """This process's cgroup from /proc/self/cgroup: v2's (controller None) or the v1
    hierarchy that has `controller`."""
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if controller is None and controllers == "":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return None


def prepare(weight: int, *, root: Path = CGROUP_ROOT, self_cgroup: str | None = None) -> RunGroup:
    """Make the runs' cgroup with `weight` (v2's scale: 1-10000, the service's 100)."""
    try:
        text = self_cgroup if self_cgroup is not None else Path("/proc/self/cgroup").read_text()
        if (root / "cgroup.controllers").is_file():
            return _v2(weight, root, own_cgroup(text, None))
        return _v1(weight, root, own_cgroup(text, "cpu"))
    except OSError as e:
        raise Unavailable(f"{e.filename or root}: {e.strerror or e}") from e


def _v1(weight: int, root: Path, own: str | None) -> RunGroup:
    mount = root / "cpu"
    if own is None or not (mount / "cpu.shares").is_file():
        raise Unavailable(f"no cpu controller under {root}")
    group = mount / own.lstrip("/") / V1_NAME
    group.mkdir(exist_ok=True)
    (group / "cpu.shares").write_text(str(max(2, weight * V1_SHARES // 100)))
    return RunGroup(group / "cgroup.procs", weight)


def _v2(weight: int, root: Path, own: str | None) -> RunGroup:
    if own is None:
        raise Unavailable("no cgroup v2 line in /proc/self/cgroup")
    here = root / own.lstrip("/")
    if "cpu" not in (here / "cgroup.controllers").read_text().split():
        raise Unavailable(f"{here} has no cpu controller (systemd: Delegate=cpu)")
    runs = here / "runs"
    runs.mkdir(exist_ok=True)
    if here != root:  # the root may hold processes; any other cgroup with controllers may not
        leaf = here / "service"
        leaf.mkdir(exist_ok=True)
        # A process forked while this moves the others lands beside them: move again.
        for _ in range(10):
            pids = (here / "cgroup.procs").read_text().split()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # gone meanwhile
                    (leaf / "cgroup.procs").write_text(pid)
        else:
            raise Unavailable(f"{here}: its processes would not move to {leaf}")
    enabled = (here / "cgroup.subtree_control").read_text().split()
    if "cpu" not in enabled:
        (here / "cgroup.subtree_control").write_text("+cpu")
    (runs / "cpu.weight").write_text(str(weight))
    return RunGroup(runs / "cgroup.procs", weight)


def command(group: RunGroup | None) -> list[str]:
    """The argv before `ansible-playbook` that puts a run in `group` (none without one)."""
    if group is None:
        return []
    return [sys.executable, "-m", "webhook.executor.cgroup", str(group.procs)]


def join_and_exec(argv: list[str]) -> None:
    """`python -m webhook.executor.cgroup PROCS COMMAND...`: join, then become COMMAND. A
    cgroup that went away (its directory removed by hand) leaves the run unweighted, not
    failed."""
    procs, cmd = argv[0], argv[1:]
    try:
        Path(procs).write_text(str(os.getpid()))
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EINVAL):
            raise
        print(f"slurmedic: {procs}: {e.strerror}; running unweighted", file=sys.stderr)
    os.execvp(cmd[0], cmd)  # noqa: S606 - argv as given, no shell: ansible-playbook's own


if __name__ == "__main__":
    join_and_exec(sys.argv[1:])
