"""`slurmedic replay`: run the real core over a scenario file."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from webhook.replay import ScenarioError, replay_json


@click.command()
@click.argument("scenario", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON (the contract).")
def replay(scenario: Path, as_json: bool) -> None:
    """Replay SCENARIO (YAML) through the decision core on a simulated clock."""
    try:
        result = replay_json(scenario)
    except ScenarioError as e:
        click.echo(f"slurmedic replay: {e}", err=True)
        raise SystemExit(2) from e
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
