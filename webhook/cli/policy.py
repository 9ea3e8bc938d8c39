"""`slurmedic policy check FILE`: validate a policy file, naming the bad key."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from webhook.cli.common import policy_of


@click.group()
def policy() -> None:
    """The policy file: modes, scope, retry budget, circuit breaker, shared-cause thresholds."""


@policy.command()
@click.argument("path", type=click.Path(path_type=Path))
def check(path: Path) -> None:
    """Validate PATH; print the effective policy (defaults filled in) when it is valid."""
    p = policy_of(path)
    click.echo(yaml.safe_dump(p.model_dump(mode="json"), sort_keys=False).rstrip())
