"""`slurmedic nodes`: each node's failures over a period beside its repairs, the nodes waiting for
replacement first, then the lemons."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from webhook.cli.common import config_option, duration, ledger_of
from webhook.core import durations
from webhook.core.repair_view import NodeView
from webhook.ledger.review import node_views

ISO = "%Y-%m-%dT%H:%M:%SZ"


def _json(v: NodeView) -> dict[str, object]:
    r, latest = v.record, v.latest
    return {
        "node": v.node,
        "failures": r.failures if r else 0,
        "drains": r.drains if r else 0,
        "app_xids": r.app_xids if r else 0,
        "causes": list(r.causes) if r else [],
        "gpus": list(r.gpus) if r else [],
        "jobs": r.jobs if r else 0,
        "first": r.first.strftime(ISO) if r else None,
        "last": r.last.strftime(ISO) if r else None,
        "suspect": r.suspect if r else False,
        "status": v.status,
        "awaiting_replacement": v.awaiting_replacement,
        "repairs": len(v.repairs),
        "repair": None
        if latest is None
        else {
            "key": latest.repair.key,
            "state": latest.repair.state,
            "plan": latest.repair.plan,
            "since": (latest.repair.since or latest.repair.started).strftime(ISO),
            "reason": latest.reason,
        },
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
    """Each node's failures (drains for its own faults, application XIDs on its GPUs) beside its
    latest repair, the nodes waiting for replacement first, then the ones that fail most;
    `suspect`: repeats within the policy's `repeats` window."""
    ledger = ledger_of(config_path)
    since = datetime.now(UTC) - period
    views = node_views(ledger, since)[:limit]
    if as_json:
        click.echo(json.dumps([_json(v) for v in views], indent=1))
        return
    t = Table(title=f"slurmedic nodes: failures and repairs in the last {durations.format(period)}")
    # Whatever the terminal's width, a node's name is never cut: the other columns wrap.
    t.add_column("node", no_wrap=True, min_width=max((len(v.node) for v in views), default=4))
    for col in ("failures", "drains", "app XIDs", "causes", "jobs", "last", "suspect"):
        t.add_column(col)
    t.add_column("repair: state (plan), since")
    t.add_column("repairs")
    for v in views:
        r, latest = v.record, v.latest
        repair = ""
        if latest is not None:
            repair = f"{latest.repair.state} ({latest.repair.plan})"
            repair += ": waiting for a person" if v.awaiting_replacement else ""
            repair += f", {latest.repair.since or latest.repair.started:%Y-%m-%d %H:%M}"
        t.add_row(
            v.node,
            str(r.failures) if r else "0",
            str(r.drains) if r else "0",
            (str(r.app_xids) + (f" ({len(r.gpus)} GPU)" if r.gpus else "")) if r else "0",
            ", ".join(r.causes) if r else "",
            str(r.jobs) if r else "0",
            r.last.strftime("%Y-%m-%d %H:%M") if r else "",
            "yes" if r and r.suspect else "",
            repair,
            str(len(v.repairs)) if v.repairs else "",
        )
    console = Console()
    if not console.is_terminal:
        # Read by a program or kept in a file: one line a node, not rich's 80 columns.
        console = Console(width=200)
    console.print(t if views else "no node failed or was repaired in that period")
