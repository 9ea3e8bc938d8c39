"""`slurmedic policy check FILE`: validate a policy file, naming the bad key."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from webhook.core.policy import PolicyError, load_policy


@click.group()
def policy() -> None:
    """The policy file: modes, scope, retry budget, circuit breaker, shared-cause thresholds."""


@policy.command()
@click.argument("path", type=click.Path(path_type=Path))
def check(path: Path) -> None:
    """Validate PATH; print the effective policy (defaults filled in) when it is valid."""
    try:
        data = yaml.safe_load(path.read_text())
        p = load_policy(data)
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise click.ClickException(f"{path}: not YAML ({str(e).splitlines()[0]})") from e
    except PolicyError as e:
        raise click.ClickException(f"{path}: {e}") from e
    click.echo(yaml.safe_dump(p.model_dump(mode="json"), sort_keys=False).rstrip())
