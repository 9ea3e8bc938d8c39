"""The playbook runs' share of the CPU: a cgroup of their own, weighted below the service's.

A storm brings alerts and playbook runs at once. On a small controller the runs (each an
`ansible-playbook` and its modules' Python processes, 1.5-2.5 CPU seconds) take the CPU from the
webhook while Alertmanager waits for its answers, and a late answer is a re-delivery. In a
cgroup with a lower CPU weight, the runs give way when the CPU is short, and take all of it when
it is not: a weight is a share under contention, not a limit.

A nice value does not do this: ansible-runner starts each run in a session of its own, and
Ansible each task's worker (setsid). Where the kernel groups CPU time by session (autogroups,
in force for processes outside a CPU cgroup) a nice value counts only within its session.

`serve` prepares the cgroup once, before it starts anything, and its loop (started again or not)
inherits it through the environment (RUN_CGROUP_ENV).

- cgroup v2 (systemd's hosts): only in a cgroup systemd marks delegated (`Delegate=cpu`,
  systemd 251 and later) where `serve` is alone. v2 lets processes live only in leaves: `serve`
  moves itself to a leaf `service`, the runs go to a leaf `runs`. Never in a root cgroup (the
  host's, or a container's namespace root): dividing it is not slurmedic's call.
- cgroup v1: a child `slurmedic-runs` of the service's cpu cgroup, `cpu.shares` in proportion.
  Processes left in that parent compete one by one against the runs' group; where the parent
  is the root (no CPU accounting), the runs give way to the whole host.
- Neither: the runs are not weighted, and `serve` says why once.

A run joins its cgroup itself, before it becomes `ansible-playbook` (`python -m
webhook.executor.cgroup PROCS COMMAND...`), so that every process it starts is in it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from webhook.core.validation import is_number

CGROUP_ROOT = Path("/sys/fs/cgroup")
RUN_CGROUP_ENV = "SLURMEDIC_RUN_CGROUP"  # serve's prepared group for its loop: "WEIGHT PROCS"
V1_SHARES = 1024  # v1's default cpu.shares, v2's default cpu.weight is 100
V1_NAME = "slurmedic-runs"
LEAF = "service"  # v2: where serve and what it starts live
RUNS = "runs"


class Unavailable(Exception):
    """No cgroup for the runs here: the reason, for the log."""


@dataclass(frozen=True)
class RunGroup:
    procs: Path  # the cgroup.procs a run writes its pid into
    weight: int  # in cgroup v2's terms (default 100)

    def env(self) -> str:
        return f"{self.weight} {self.procs}"

    @classmethod
    def from_env(cls, value: str) -> RunGroup | None:
        weight, _, procs = value.partition(" ")
        return cls(Path(procs), int(weight)) if is_number(weight) and procs else None


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


DELEGATE_MARKS = ("trusted.delegate", "user.delegate")  # systemd's, on a delegated cgroup


def delegated(path: Path) -> bool:
    """Whether `path` was handed to this service to manage: systemd marks a cgroup it delegates
    (`Delegate=`, systemd 251 and later) with these attributes. Ownership is no sign: under a
    user's systemd every cgroup is the user's, delegated or not."""
    for mark in DELEGATE_MARKS:
        try:
            if os.getxattr(path, mark) == b"1":
                return True
        except OSError:
            continue  # unset, or not readable (trusted.* needs root)
    return False


def prepare(
    weight: int,
    *,
    root: Path = CGROUP_ROOT,
    self_cgroup: str | None = None,
    v1_name: str = V1_NAME,
) -> RunGroup:
    """Make the runs' cgroup with `weight` (v2's scale: 1-10000, the service's 100)."""
    try:
        text = self_cgroup if self_cgroup is not None else Path("/proc/self/cgroup").read_text()
        if (root / "cgroup.controllers").is_file():
            return _v2(weight, root, own_cgroup(text, None))
        return _v1(weight, root, own_cgroup(text, "cpu"), v1_name)
    except OSError as e:
        raise Unavailable(f"{e.filename or root}: {e.strerror or e}") from e


def _v1(weight: int, root: Path, own: str | None, name: str) -> RunGroup:
    mount = root / "cpu"
    if own is None or not (mount / "cpu.shares").is_file():
        raise Unavailable(f"no cpu controller under {root}")
    group = mount / own.lstrip("/") / name
    group.mkdir(exist_ok=True)
    (group / "cpu.shares").write_text(str(max(2, weight * V1_SHARES // 100)))
    return RunGroup(group / "cgroup.procs", weight)


def _v2(weight: int, root: Path, own: str | None) -> RunGroup:
    if own is None:
        raise Unavailable("no cgroup v2 line in /proc/self/cgroup")
    here = root / own.lstrip("/")
    moved = here.name == LEAF and (here.parent / RUNS).is_dir()
    base = here.parent if moved else here  # already in place: a serve started in its leaf
    # The host's root has no cgroup.type; a cgroup namespace's root (a container's) shows as
    # "/" and has one: neither is slurmedic's to divide.
    if own == "/" or not (base / "cgroup.type").exists():
        raise Unavailable(f"{base} is a root cgroup: give slurmedic one of its own")
    if "cpu" not in (base / "cgroup.controllers").read_text().split():
        raise Unavailable(f"{base} has no cpu controller (systemd: Delegate=cpu)")
    if not delegated(base):
        raise Unavailable(
            f"{base} is not marked delegated ({' or '.join(DELEGATE_MARKS)}: systemd 251 and "
            "later set it for Delegate=cpu)"
        )
    if not moved:
        others = set((here / "cgroup.procs").read_text().split()) - {str(os.getpid())}
        if others:
            raise Unavailable(
                f"{here} holds other processes ({', '.join(sorted(others)[:5])}): "
                "slurmedic moves only itself"
            )
        # Moved out before +cpu: a cgroup with processes in it cannot enable a controller for
        # its children (the kernel says EBUSY).
        (here / LEAF).mkdir(exist_ok=True)
        (here / LEAF / "cgroup.procs").write_text(str(os.getpid()))
    (base / RUNS).mkdir(exist_ok=True)
    if "cpu" not in (base / "cgroup.subtree_control").read_text().split():
        (base / "cgroup.subtree_control").write_text("+cpu")
    (base / RUNS / "cpu.weight").write_text(str(weight))
    return RunGroup(base / RUNS / "cgroup.procs", weight)


def command(group: RunGroup | None) -> list[str]:
    """The argv before `ansible-playbook` that puts a run in `group` (none without one)."""
    if group is None:
        return []
    return [sys.executable, "-m", "webhook.executor.cgroup", str(group.procs)]


def join_and_exec(argv: list[str]) -> None:
    """`python -m webhook.executor.cgroup PROCS COMMAND...`: join, then become COMMAND. A
    cgroup that cannot be joined (removed by hand, say) leaves the run unweighted, not failed."""
    procs, cmd = argv[0], argv[1:]
    try:
        Path(procs).write_text(str(os.getpid()))
    except OSError as e:
        print(f"slurmedic: {procs}: {e.strerror or e}; running unweighted", file=sys.stderr)
    os.execvp(cmd[0], cmd)  # noqa: S606 - argv as given, no shell: ansible-playbook's own


if __name__ == "__main__":
    join_and_exec(sys.argv[1:])
