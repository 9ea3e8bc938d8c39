"""`slurmedic review | approve | reject | verdict`: the human side of approve mode and the trial."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click
from rich.console import Console

from webhook.cli.common import config_option, decision_table, ledger_of
from webhook.core.lifecycle import APPROVED, AWAITING_APPROVAL, REJECTED
from webhook.core.verdicts import JUDGEMENTS, MEANS, WOULD, VerdictError
from webhook.core.verdicts import verdict as make_verdict
from webhook.ledger.review import NotWaiting, add_verdict, judge
from webhook.ledger.store import last_dry_run


@click.command()
@config_option
def review(config_path: Path | None) -> None:
    """Recommendations waiting for a human (approve mode), with their dry-run commands."""
    ledger = ledger_of(config_path)
    rows = ledger.in_state(AWAITING_APPROVAL)
    if not rows:
        click.echo("nothing waits for approval")
        return
    c = Console()
    c.print(decision_table("waiting for approval", rows, last="reason"))
    for row in rows:
        found = ledger.decision(row.id)
        commands = last_dry_run(found[1]) if found else None
        c.print(f"{row.id} {row.action}: would run", end="")
        if commands is None:
            c.print(" (dry run not recorded yet)")
            continue
        c.print(":" if commands else " nothing (already done)")
        for cmd in commands:
            c.print(f"  {cmd}", markup=False, highlight=False, soft_wrap=True)
    click.echo("decisions show ID | approve ID | reject ID --reason ...")


def _decide(config_path: Path | None, decision_id: int, state: str, detail: dict[str, str]) -> None:
    try:
        row = judge(ledger_of(config_path), decision_id, state, detail, datetime.now(UTC))
    except NotWaiting as e:
        raise click.ClickException(str(e)) from e
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

    _decide(config_path, decision_id, APPROVED, {"by": by or getpass.getuser()})


@click.command()
@config_option
@click.argument("decision_id", type=int)
@click.option("--reason", required=True, help="Why not (kept in the ledger).")
@click.option("--by", default=None, help="Who rejects (default: the login name).")
def reject(config_path: Path | None, decision_id: int, reason: str, by: str | None) -> None:
    """Reject a recommendation: nothing is carried out."""
    import getpass

    _decide(config_path, decision_id, REJECTED, {"by": by or getpass.getuser(), "reason": reason})


@click.command()
@config_option
@click.argument("decision_id", type=int)
@click.argument("judgement", type=click.Choice(JUDGEMENTS))
@click.option(
    "--would",
    type=click.Choice(WOULD),
    default=None,
    help="disagree: what you would have done instead, an action or "
    + "; ".join(f"{k} ({v})" for k, v in MEANS.items())
    + ".",
)
@click.option("--note", default="", help="Why (kept with the verdict).")
@click.option("--by", default=None, help="Who judges (default: the login name).")
def verdict(
    config_path: Path | None,
    decision_id: int,
    judgement: str,
    would: str | None,
    note: str,
    by: str | None,
) -> None:
    """Record your verdict on a decision, in any mode, one to do nothing (`none`) too: agree,
    disagree or unsure."""
    import getpass

    try:
        v = make_verdict(verdict=judgement, would=would, note=note, by=by or getpass.getuser())
    except VerdictError as e:
        raise click.ClickException(str(e)) from e
    ledger = ledger_of(config_path)
    try:
        add_verdict(ledger, decision_id, v, datetime.now(UTC))
    except KeyError:
        raise click.ClickException(f"decision {decision_id} is not in the ledger") from None
    click.echo(f"decision {decision_id}: {v.verdict}" + (f" (would {v.would})" if v.would else ""))
