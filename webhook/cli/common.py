"""What the commands share: the --config/--policy options, the ledger, a decisions table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click
from rich.table import Table

from webhook.ledger.schema import DecisionRow
from webhook.ledger.store import Ledger
from webhook.service.config import ConfigError, load_config

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


def ledger_of(config_path: Path | None) -> Ledger:
    try:
        return Ledger(load_config(config_path).database_url)
    except ConfigError as e:
        raise click.ClickException(str(e)) from e


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
