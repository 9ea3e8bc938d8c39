"""`slurmedic review | approve | reject`: the human side of approve mode."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click
from rich.console import Console

from webhook.cli.common import config_option, decision_table, ledger_of
from webhook.core.lifecycle import IllegalTransition


@click.command()
@config_option
def review(config_path: Path | None) -> None:
    """Recommendations waiting for a human (approve mode), with their dry-run commands."""
    ledger = ledger_of(config_path)
    rows = ledger.in_state("awaiting_approval")
    if not rows:
        click.echo("nothing waits for approval")
        return
    t = decision_table("waiting for approval", rows, last="reason")
    Console().print(t)
    click.echo("decisions show ID | approve ID | reject ID --reason ...")


def _decide(config_path: Path | None, decision_id: int, state: str, detail: dict[str, str]) -> None:
    ledger = ledger_of(config_path)
    found = ledger.decision(decision_id)
    if found is None:
        raise click.ClickException(f"decision {decision_id} is not in the ledger")
    row, _ = found
    if row.state != "awaiting_approval":
        raise click.ClickException(f"decision {decision_id} is {row.state}, not awaiting_approval")
    try:
        ledger.add_event(decision_id, state, detail, datetime.now(UTC))
    except IllegalTransition as e:  # superseded or moved on since it was read
        raise click.ClickException(f"decision {decision_id}: {e}") from e
    click.echo(
        f"decision {decision_id} ({row.action} {', '.join(row.nodes or row.exclude)}) {state}"
    )


@click.command()
@config_option
@click.argument("decision_id", type=int)
@click.option("--by", default=None, help="Who approves (default: the login name).")
def approve(config_path: Path | None, decision_id: int, by: str | None) -> None:
    """Approve a recommendation: slurmedic carries it out on its next step."""
    import getpass

    _decide(config_path, decision_id, "approved", {"by": by or getpass.getuser()})


@click.command()
@config_option
@click.argument("decision_id", type=int)
@click.option("--reason", required=True, help="Why not (kept in the ledger).")
@click.option("--by", default=None, help="Who rejects (default: the login name).")
def reject(config_path: Path | None, decision_id: int, reason: str, by: str | None) -> None:
    """Reject a recommendation: nothing is carried out."""
    import getpass

    _decide(config_path, decision_id, "rejected", {"by": by or getpass.getuser(), "reason": reason})
