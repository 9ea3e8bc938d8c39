"""`slurmedic rules ...`: render and check the alert rules."""

from __future__ import annotations

from pathlib import Path

import click

from webhook.rules.render import RULES_DIR, RulesError, RuleSource


@click.group()
def rules() -> None:
    """slurmedic's Prometheus alert rules (alert_rules/)."""


@rules.command()
@click.option(
    "--profile",
    help="Profiles of alert_rules/config.yml over the defaults (e.g. lab, or lab,slurm-native).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=RULES_DIR,
    show_default=True,
    help="Where to write the *.rules.yml files.",
)
def render(profile: str | None, out: Path) -> None:
    """Render the rule templates with the thresholds of alert_rules/config.yml."""
    try:
        source = RuleSource()
        written = source.write(out, profile)
        if profile is None and out == RULES_DIR:
            written += source.write_variants()
    except RulesError as e:
        raise click.ClickException(str(e)) from e
    for path in written:
        click.echo(path)


@rules.command()
def check() -> None:
    """Fail when alert_rules/*.rules.yml differ from a fresh render of config.yml."""
    try:
        stale = RuleSource().stale()
    except RulesError as e:
        raise click.ClickException(str(e)) from e
    if stale:
        raise click.ClickException(
            f"{', '.join(stale)} differ from templates + config.yml: run `slurmedic rules render`"
        )
    click.echo("rendered rules are up to date")
