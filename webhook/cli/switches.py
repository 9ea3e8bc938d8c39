"""`slurmedic switch`, `slurmedic breaker`, `slurmedic resume`: what a human flips and does."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from webhook.cli.common import config_of, config_option, ledger_of
from webhook.core.decisions import Decision
from webhook.core.incidents import IncidentKey
from webhook.core.lifecycle import EXECUTED, FAILED
from webhook.executor.runner import INVENTORY, run_playbook
from webhook.ledger.settings import Breaker, CorruptSetting, Switch


@click.command()
@config_option
@click.argument("to", type=click.Choice(["monitor", "policy"]))
def switch(config_path: Path | None, to: str) -> None:
    """Send every action back to monitor mode at once (`monitor`), or follow the policy again."""
    ledger = ledger_of(config_path)
    ledger.put(Switch(monitor=to == "monitor"), datetime.now(UTC))
    if to == "monitor":
        click.echo("every action now runs in check mode only, whatever the policy says")
    else:
        click.echo("actions follow the policy's modes again")


@click.group()
def breaker() -> None:
    """The circuit breaker on drains (it never resets itself)."""


@breaker.command()
@config_option
def status(config_path: Path | None) -> None:
    """Is the breaker open?"""
    try:
        state = ledger_of(config_path).setting(Breaker)
    except CorruptSetting as e:
        raise click.ClickException(str(e)) from e
    if state.open:
        since = state.opened_at.isoformat() if state.opened_at else "an unknown time"
        click.echo(f"open since {since}: drains become escalations")
    else:
        click.echo("closed" + (f" (reset {state.reset_at.isoformat()})" if state.reset_at else ""))


@breaker.command()
@config_option
def reset(config_path: Path | None) -> None:
    """Close the breaker; drains before now no longer count against it."""
    now = datetime.now(UTC)
    ledger_of(config_path).put(Breaker(open=False, reset_at=now), now)
    click.echo("breaker closed")


@click.command()
@config_option
@click.argument("nodes", nargs=-1, required=True)
def resume(config_path: Path | None, nodes: tuple[str, ...]) -> None:
    """Return repaired NODES to service (only nodes slurmedic drained)."""
    config = config_of(config_path)
    ledger = ledger_of(config_path)
    env = config.cluster.playbook_env()
    now = datetime.now(UTC)
    try:
        result = run_playbook(
            "resume_nodes",
            {"slurmedic_nodes": list(nodes), "slurmedic_slurm_env": env},
            check=False,
            inventory=config.executor.inventory or INVENTORY,
        )
    except ValueError as e:  # a node name that is not one
        raise click.ClickException(f"nodes: {str(e).splitlines()[0]}") from e
    import getpass

    decision = Decision(
        at=now,
        incident=str(IncidentKey.resuming(tuple(nodes))),
        job=None,
        action="resume",
        cause="unknown",
        reason=f"{getpass.getuser()} returned {', '.join(nodes)} to service",
        nodes=tuple(nodes),
        mode="enforce",
        state=EXECUTED if result.ok else FAILED,
    )
    (decision_id,) = ledger.record(
        [decision], detail={"by": getpass.getuser(), "run": result.summary()}
    )
    if not result.ok:
        raise click.ClickException(
            f"resume failed (decision {decision_id}): {result.output[-300:]}"
        )
    done = result.commands or ["nothing: none of them was drained by slurmedic"]
    click.echo(f"decision {decision_id}: " + "; ".join(done))
