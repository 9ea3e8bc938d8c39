"""A mistake in what an operator gives a command is one line naming what is wrong, never a
traceback, and never a new file: a read command does not make an empty ledger (it would show
nothing, or take a switch nobody reads), a mistyped path makes no directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_a_read_command_never_makes_a_ledger(tmp_path: Path) -> None:
    for args in (("decisions", "list"), ("review",), ("switch", "monitor"), ("trial", "report")):
        line = one_line(cli(tmp_path, *args))
        assert "no ledger at" in line and "slurmedic.db" in line and "give --config" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_mistyped_sqlite_path_makes_no_directory(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump({"database_url": f"sqlite:///{tmp_path}/typo/ledger.db"}))
    line = one_line(cli(tmp_path, "decisions", "list", f"--config={config}"))
    assert f"directory {tmp_path}/typo does not exist" in line and str(config) in line
    assert not (tmp_path / "typo").exists()


def test_an_unreachable_postgresql_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    url = "postgresql+psycopg://slurmedic@127.0.0.1:1/slurmedic?connect_timeout=2"
    config.write_text(yaml.safe_dump({"database_url": url}))
    line = one_line(cli(tmp_path, "decisions", "list", f"--config={config}"))
    assert line.startswith("Error: database_url:") and "127.0.0.1" in line, line


def test_serve_names_a_missing_token_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump({"auth": {"bearer_token_file": str(tmp_path / "none")}}))
    line = one_line(cli(tmp_path, "serve", f"--config={config}"))
    assert "auth.bearer_token_file" in line and str(tmp_path / "none") in line, line


def test_backtest_names_what_is_wrong_before_it_reads_anything(tmp_path: Path) -> None:
    policy = tmp_path / "p.yml"
    policy.write_text("mode: sometimes\n")
    unreachable = "--prometheus=http://127.0.0.1:1"
    line = one_line(cli(tmp_path, "backtest", "--from=1h", unreachable, f"--policy={policy}"))
    assert str(policy) in line and "mode:" in line, line
    bad = cli(tmp_path, "backtest", "--from=1h", unreachable, "--window=3x")
    assert bad.returncode == 2 and "--window" in bad.stderr and "Traceback" not in bad.stderr
    line = one_line(cli(tmp_path, "backtest", "--from=1h", unreachable))
    assert line.startswith("Error: alert history: http://127.0.0.1:1"), line
    assert list(tmp_path.iterdir()) == [policy]
