"""What the service tests share: a real PostgreSQL server, and a ledger on either backend."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from webhook.ledger.schema import Base
from webhook.ledger.store import Ledger
from webhook.service.config import ServiceConfig

PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))


def console_config(tmp_path: Path, db: str, users_file: Path, **extra: Any) -> ServiceConfig:
    """A service config with the console on (its token and key files written in `tmp_path`)."""
    (tmp_path / "token").write_text("t0ken")
    (tmp_path / "key").write_text("k" * 32)
    return ServiceConfig.model_validate(
        {
            "database_url": db,
            "metrics_cache_seconds": 0,
            "auth": {"bearer_token_file": str(tmp_path / "token")},
            "console": {
                "enabled": True,
                "users_file": str(users_file),
                "secret_key_file": str(tmp_path / "key"),
            },
            **extra,
        }
    )


def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> Path:
    """An executable `name` (a shell `script`) first on PATH, then this interpreter's bin (where
    ansible-runner finds ansible-playbook, as the runner arranges)."""
    fake = tmp_path / "bin" / name
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(script)
    fake.chmod(0o755)
    bin_dirs = (fake.parent, Path(sys.executable).parent, os.environ["PATH"])
    monkeypatch.setenv("PATH", os.pathsep.join(map(str, bin_dirs)))
    return fake


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on loopback, run as the postgres user, stopped after."""
    assert PG_BIN, "PostgreSQL is not installed (scripts/setup.sh installs it)"
    bin_dir = PG_BIN[-1]
    data = Path(tempfile.mkdtemp(prefix="slurmedic-pg-"))
    shutil.chown(data, "postgres", "postgres")
    port = free_port()
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_pg, str(bin_dir / "initdb"), "-D", str(data / "db"), "-A", "trust", "-U", "slurmedic"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_pg,
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data / "db"),
            "-l",
            str(data / "log"),
            "-w",
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://slurmedic@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_pg, str(bin_dir / "pg_ctl"), "-D", str(data / "db"), "-m", "fast", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    if request.param == "sqlite":
        return Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    url = request.getfixturevalue("postgres_url")
    ledger = Ledger(url)
    with ledger.engine.begin() as conn:  # a clean slate per test
        for table in Base.metadata.sorted_tables:
            conn.exec_driver_sql(f"TRUNCATE {table.name} RESTART IDENTITY CASCADE")
    return ledger
