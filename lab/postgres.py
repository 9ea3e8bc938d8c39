"""PostgreSQL for the lab: the ledger several slurmedic replicas share.

Debian's server binaries (scripts/setup.sh installs them), one cluster under the run dir, run
in the foreground as the `postgres` user by PID like every lab daemon, on loopback only with
trust authentication (nothing but this machine can reach it). The service tests use the same
cluster code (tests/service/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from lab import processes
from lab.config import LabConfig
from lab.slurm import LabError

AS_POSTGRES = ["runuser", "-u", "postgres", "--"]
USER = "slurmedic"


def bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not found:
        raise LabError("PostgreSQL is not installed (scripts/setup.sh installs it)")
    return found[-1]


def init(data: Path) -> None:
    """A new cluster in `data` (made, and owned by postgres) unless one is there."""
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.chown(data, "postgres", "postgres")
    if (data / "db" / "PG_VERSION").exists():
        return
    subprocess.run(
        [*AS_POSTGRES, str(bin_dir() / "initdb"), "-D", str(data / "db"), "-A", "trust",
         "-U", USER],
        check=True,
        capture_output=True,
    )  # fmt: skip


def argv(data: Path, port: int) -> list[str]:
    """The server in the foreground: loopback only, its socket in `data`."""
    return [
        *AS_POSTGRES,
        str(bin_dir() / "postgres"),
        "-D",
        str(data / "db"),
        "-p",
        str(port),
        "-k",
        str(data),
        "-c",
        "listen_addresses=127.0.0.1",
    ]


def url(port: int, database: str = "postgres") -> str:
    return f"postgresql+psycopg://{USER}@127.0.0.1:{port}/{database}"


def answers(port: int) -> bool:
    import psycopg  # the `postgres` extra: a wheel without it still runs the rest of the lab

    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user={USER} dbname=postgres"):
            return True
    except psycopg.OperationalError:
        return False


def data_dir(cfg: LabConfig) -> Path:
    """The lab's cluster: outside the run dir, which the postgres user may not enter (it is
    root's, 0700 under pytest); one per port base, as the lab is."""
    return Path(tempfile.gettempdir()) / f"slurmedic-lab-postgres-{cfg.port_base}"


def start(cfg: LabConfig) -> str:
    """The lab's PostgreSQL, started unless it runs; its URL once it answers."""
    data = data_dir(cfg)
    init(data)
    port = cfg.postgres_port
    processes.start(cfg, "postgres", argv(data, port))
    if not processes.wait_until(lambda: answers(port), 60, 0.2):
        raise LabError(f"PostgreSQL does not answer on port {port}; see {cfg.logs}/postgres.out")
    return url(port)


def new_database(cfg: LabConfig, name: str) -> str:
    """A fresh, empty database `name` on the lab's server (dropped first if it exists)."""
    import psycopg

    with psycopg.connect(
        f"host=127.0.0.1 port={cfg.postgres_port} user={USER} dbname=postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url(cfg.postgres_port, name)


def restart(cfg: LabConfig) -> None:
    """PostgreSQL's fast shutdown (every session cut, as a failover or an upgrade does), then
    the server again on the same data."""
    pid = processes.read_pid(cfg, "postgres")
    if pid is None:
        raise LabError("the lab's PostgreSQL does not run")
    subprocess.run(
        [*AS_POSTGRES, str(bin_dir() / "pg_ctl"), "-D", str(data_dir(cfg) / "db"), "-m", "fast",
         "-w", "stop"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    if not processes.wait_until(lambda: not processes.group_members(pid), 60, 0.1):
        raise LabError(f"PostgreSQL did not stop; see {cfg.logs}/postgres.out")
    processes.stop(cfg, "postgres")  # forget its pid file
    start(cfg)


def pause(cfg: LabConfig, stopped: bool) -> None:
    """Stop (SIGSTOP) or continue the whole server: stopped, it answers nothing (a hung
    server; the kernel still takes connections and acknowledges data, so this is not a network
    cut: clients wait, none is refused)."""
    pid = processes.read_pid(cfg, "postgres")
    if pid is None:
        raise LabError("the lab's PostgreSQL does not run")
    if stopped:
        os.killpg(pid, signal.SIGSTOP)
        return

    def running() -> bool:
        # runuser stops itself when it sees its child stopped, and may do so after the SIGCONT
        # reached it (a race between the two): continue the group until none is stopped.
        os.killpg(pid, signal.SIGCONT)
        return not any(processes.state(m) == "T" for m in processes.group_members(pid))

    if not processes.wait_until(running, 10, 0.1):
        raise LabError("PostgreSQL's processes stay stopped after SIGCONT")
