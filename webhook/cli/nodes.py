"""`slurmedic nodes`: each node's failures over a period, the lemons first."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from webhook.cli.common import config_option, duration, ledger_of
from webhook.core import durations
from webhook.core.failures import NodeRecord
from webhook.ledger.review import node_records


def _json(r: NodeRecord) -> dict[str, object]:
    return {
        "node": r.node,
        "failures": r.failures,
        "drains": r.drains,
        "app_xids": r.app_xids,
        "causes": list(r.causes),
        "gpus": list(r.gpus),
        "jobs": r.jobs,
        "first": r.first.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "last": r.last.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "suspect": r.suspect,
    }


@click.command()
@config_option
@click.option(
    "--since",
    "period",
    default="30d",
    show_default=True,
    callback=duration,
    help="How far back to look (a duration: 7d, 12h).",
)
@click.option("--json", "as_json", is_flag=True)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1))
def nodes(config_path: Path | None, period: timedelta, as_json: bool, limit: int) -> None:
    """Each node's failures (drains for its own faults, application XIDs on its GPUs), the
    ones that fail most first; `suspect`: repeats within the policy's `repeats` window."""
    ledger = ledger_of(config_path)
    since = datetime.now(UTC) - period
    records = node_records(ledger, since)[:limit]
    if as_json:
        click.echo(json.dumps([_json(r) for r in records], indent=1))
        return
    t = Table(title=f"slurmedic nodes: failures in the last {durations.format(period)}")
    for col in ("node", "failures", "drains", "app XIDs", "causes", "jobs", "last", "suspect"):
        t.add_column(col)
    for r in records:
        t.add_row(
            r.node,
            str(r.failures),
            str(r.drains),
            str(r.app_xids) + (f" ({len(r.gpus)} GPU)" if r.gpus else ""),
            ", ".join(r.causes),
            str(r.jobs),
            r.last.strftime("%Y-%m-%d %H:%M"),
            "yes" if r.suspect else "",
        )
    Console().print(t if records else "no node failed in that period")
