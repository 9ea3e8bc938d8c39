"""Start and stop the lab's daemons by PID.

Daemons run in the foreground of their own session, their PID in `<run>/pid/<name>.pid`,
their output in `<run>/log/<name>.out`. There is no systemd here and PID 1 may not reap
orphans, so a zombie counts as stopped (the state letter in /proc/PID/stat, not `kill -0`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from lab.config import MARKER_ENV, LabConfig
from webhook.cli.keeper import running


def port_in_use(port: int) -> bool:
    """Something listens on (or holds) this loopback port: a daemon meant for it would fail."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


is_alive = running  # alive and not a zombie: the keeper's reading of /proc


def read_pid(cfg: LabConfig, name: str) -> int | None:
    try:
        pid = int((cfg.pids / f"{name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if is_alive(pid) else None


def start(
    cfg: LabConfig,
    name: str,
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Start `argv` as daemon `name` unless it already runs; return its PID."""
    existing = read_pid(cfg, name)
    if existing is not None:
        return existing
    cfg.pids.mkdir(parents=True, exist_ok=True)
    cfg.logs.mkdir(parents=True, exist_ok=True)
    with (cfg.logs / f"{name}.out").open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env or cfg.env(),
            cwd=cwd or cfg.run_dir,
            start_new_session=True,
        )
    (cfg.pids / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def stop_pid(pid: int, *, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds (slurmd ignores TERM while it retries).

    A daemon the lab started leads a session of its own: the signals go to its whole process
    group, and it is stopped when the whole group is, so what it started goes with it
    (`slurmedic serve`'s loop must not go on deciding beside the next test's serve)."""
    try:
        group = os.getpgid(pid) == pid
    except ProcessLookupError:
        return

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)

    def gone() -> bool:
        return not (group_members(pid) if group else is_alive(pid))

    send(signal.SIGTERM)
    if wait_until(gone, grace):
        return
    send(signal.SIGKILL)
    wait_until(gone, 5.0)


def state(pid: int) -> str:
    """The process's state letter (R, S, T for stopped, Z, ...), or "" when it is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def stop(cfg: LabConfig, name: str, *, grace: float = 5.0) -> bool:
    """Stop daemon `name`; True when it was running."""
    pid = read_pid(cfg, name)
    pidfile = cfg.pids / f"{name}.pid"
    if pid is None:
        pidfile.unlink(missing_ok=True)
        return False
    stop_pid(pid, grace=grace)
    pidfile.unlink(missing_ok=True)
    return True


def marked_pids(cfg: LabConfig) -> Iterator[int]:
    """Every live process whose environment names this lab: daemons, slurmstepd, job tasks."""
    marker = f"{MARKER_ENV}={cfg.run_dir}".encode()
    conf_marker = f"SLURM_CONF={cfg.slurm_conf}".encode()
    spare = _ancestors()
    group = os.getpgrp()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        # The caller's own pipeline (`slurmedic lab down | tail`) carries the marker it was
        # given, and is no lab process: the lab starts each of its own in a session of its own.
        if _group_of(int(entry.name)) == group:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (marker in environ or conf_marker in environ) and is_alive(int(entry.name)):
            yield int(entry.name)


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """Every live process below `root` (slurmd's slurmstepd and job tasks, for one)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = parent_of(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return [p for p in found if is_alive(p)]


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _ancestors() -> set[int]:
    """This process and its parents: a caller that carries the marker is never a stray."""
    pids: set[int] = set()
    pid: int | None = os.getpid()
    while pid is not None and pid > 1:
        pids.add(pid)
        pid = parent_of(pid)
    return pids


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return True
        except Exception:  # noqa: S110 - a probe that errors is a probe that is not ready yet
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
