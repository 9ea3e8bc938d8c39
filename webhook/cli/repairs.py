"""`slurmedic repairs`: the repairs of the nodes slurmedic drained, newest first, each with where
it stands, why, and its steps."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from webhook.cli.common import config_option, duration, ledger_of
from webhook.core import durations
from webhook.core.repair_view import step_text
from webhook.core.repairs import STATES, Repair, Step

ISO = "%Y-%m-%dT%H:%M:%SZ"


def _step_json(s: Step) -> dict[str, object]:
    return {
        "id": s.id,
        "action": s.action,
        "state": s.state,
        "at": s.at.strftime(ISO),
        "done_at": s.done_at.strftime(ISO) if s.done_at else None,
        "passed": s.passed,
        "detail": s.detail,
    }


def _json(r: Repair, reason: str) -> dict[str, object]:
    d = r.drained
    return {
        "key": r.key,
        "node": r.node,
        "plan": r.plan,
        "why": r.why,
        "state": r.state,
        "since": (r.since or r.started).strftime(ISO),
        "reason": reason,
        "started": r.started.strftime(ISO),
        "dry_run": r.dry_run,
        "drain": {
            "id": d.drain,
            "incident": d.incident,
            "cause": d.cause,
            "at": d.at.strftime(ISO),
        },
        "steps": [_step_json(s) for s in r.steps],
    }


def _line(r: Repair, reason: str) -> str:
    since = f"{r.since or r.started:%Y-%m-%d %H:%M}"
    steps = "; ".join(step_text(s) for s in r.steps) or "none yet"
    dry = " [dry run: its drain did not run]" if r.dry_run else ""
    why = f" ({reason})" if reason else ""
    return (
        f"{r.key}  {r.node}  {r.plan} ({r.why})  {r.state} since {since}{why}{dry}  steps: {steps}"
    )


@click.command()
@config_option
@click.option(
    "--since",
    "period",
    default="7d",
    show_default=True,
    callback=duration,
    help="Repairs begun within this long (a duration: 7d, 12h).",
)
@click.option("--state", type=click.Choice(sorted(STATES)), help="Only repairs in this state.")
@click.option("--json", "as_json", is_flag=True)
def repairs(config_path: Path | None, period: timedelta, state: str | None, as_json: bool) -> None:
    """The repairs of nodes slurmedic drained, newest first: plan and why, state and since,
    why it stands there, and its steps (a reset or reboot, the health check and its verdict,
    the resume, or the escalation for replacement)."""
    since = datetime.now(UTC) - period
    found = [
        (r, reason)
        for r, reason in ledger_of(config_path).repairs.listed(since)
        if state is None or r.state == state
    ]
    if as_json:
        click.echo(json.dumps([_json(r, reason) for r, reason in found], indent=1))
        return
    if not found:
        what = f"in state {state} " if state else ""
        click.echo(f"no repair {what}begun in the last {durations.format(period)}")
    for r, reason in found:
        click.echo(_line(r, reason))
