"""`slurmedic replay`: run the real core over a scenario file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from webhook.replay import ScenarioError, load, replay_json, unmet


@click.command()
@click.argument("scenario", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON (the contract).")
@click.option(
    "--check",
    is_flag=True,
    help="Exit 1 when the scenario's expect: (decisions, never) does not hold, saying what; "
    "the output is the same.",
)
def replay(scenario: Path, as_json: bool, check: bool) -> None:
    """Replay SCENARIO (YAML) through the decision core on a simulated clock."""
    try:
        loaded = load(scenario)
        result = replay_json(loaded)
    except ScenarioError as e:
        click.echo(f"slurmedic replay: {e}", err=True)
        raise SystemExit(2) from e
    expect = loaded.expect if check else None
    for key in loaded.unknown:
        click.echo(f"slurmedic replay: {scenario}: {key}: not a key of the format", err=True)
    _print(result, as_json)
    for u in result.get("unmatched", []):
        hint = f" ({u['hint']})" if u["hint"] else ""
        click.echo(
            f"slurmedic replay: {u['alerts']} alert(s) named {u['host']}, which is no node of "
            f"the cluster: not acted on{hint}",
            err=True,
        )
    if check:
        if not expect:
            click.echo(f"slurmedic replay: {scenario}: --check, but it has no expect:", err=True)
            raise SystemExit(1)
        if failed := unmet(expect, result["decisions"]):
            for line in failed:
                click.echo(f"slurmedic replay: {scenario}: {line}", err=True)
            raise SystemExit(1)


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    table = Table(title=f"scenario {result['scenario']}")
    for col in ("at", "incident", "action", "nodes / exclude", "cause", "guard", "state", "reason"):
        table.add_column(col)
    for d in result["decisions"]:
        targets = ", ".join(d["nodes"]) or (
            f"excl. {', '.join(d['exclude'])}" if d["exclude"] else ""
        )
        table.add_row(
            d["at"][11:19],
            d["incident"],
            d["action"],
            targets,
            d["cause"],
            d["guard"] or "",
            d["state"],
            d["reason"],
        )
    Console().print(table)
