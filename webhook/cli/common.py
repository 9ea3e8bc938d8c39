"""What the commands share: the --config/--policy options and the files they name (read with
one-line errors), the ledger, a decisions table."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from webhook.core import durations
from webhook.core.policy import Policy, PolicyError, load_policy
from webhook.files import FileError, load_mapping
from webhook.ledger.schema import DecisionRow
from webhook.ledger.store import Ledger, Unavailable
from webhook.service.config import ConfigError, ServiceConfig, load_config

# How serve, its web workers and its loop write their log lines (one format, one stream).
LOG_FORMAT = "%(asctime)s %(name)s %(message)s"

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    envvar="SLURMEDIC_CONFIG",
    help="Service config (YAML); embedded defaults otherwise.",
)
policy_option = click.option(
    "--policy",
    "policy_path",
    type=click.Path(path_type=Path),
    help="Policy file; overrides the config's policy_file.",
)


def config_of(config_path: Path | None) -> ServiceConfig:
    try:
        return load_config(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from e


def policy_of(path: Path | None) -> Policy:
    """The policy in `path` (the defaults without one)."""
    if path is None:
        return Policy()
    try:
        return load_policy(load_mapping(path, "policy file"))
    except FileError as e:
        raise click.ClickException(str(e)) from e
    except PolicyError as e:
        raise click.ClickException(f"{path}: {e}") from e


def ledger_of(config_path: Path | None) -> Ledger:
    """The service's ledger, which must exist: a command never makes a new, empty one (it
    would show nothing, or take a switch nobody reads)."""
    try:
        return Ledger(config_of(config_path).database_url, create=False)
    except Unavailable as e:
        where = f"{config_path}" if config_path else "the embedded defaults (give --config)"
        raise click.ClickException(f"{e} [{where}]") from e


def render_report(
    fmt: str,
    as_json: Callable[[], Any],
    rows: Callable[[], list[list[Any]]],
    markdown: Callable[[], str],
) -> str:
    """A report in one of the formats `trial report` and `backtest` share: md, csv, json."""
    if fmt == "json":
        return json.dumps(as_json(), indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows())
        return buf.getvalue()
    return markdown()


def targets(row: DecisionRow) -> str:
    return ", ".join(row.nodes) or (f"excl. {', '.join(row.exclude)}" if row.exclude else "")


def decision_table(title: str, rows: Sequence[DecisionRow], last: str = "state") -> Table:
    """One row a decision; the last column is `state` or `reason`."""
    t = Table(title=title)
    for col in ("id", "at", "incident", "action", "nodes / exclude", "cause", "guard", last):
        t.add_column(col)
    for r in rows:
        t.add_row(
            str(r.id),
            r.at.strftime("%m-%d %H:%M:%S"),
            r.incident,
            r.action,
            targets(r),
            r.cause,
            r.guard or "",
            getattr(r, last) or "",
        )
    return t


def duration(_ctx: click.Context, _param: click.Parameter, value: str) -> timedelta:
    """A click callback: a Prometheus duration (`90s`, `7d`), or a clear error naming it."""
    try:
        return durations.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
