"""`slurmedic rules ...`: render and check the alert rules, the package's or a site's own copy."""

from __future__ import annotations

from pathlib import Path

import click

from webhook import resources
from webhook.rules.render import RULES_DIR, RulesError, RuleSource, strays

profile_option = click.option(
    "--profile",
    help="Profiles of the config over its defaults (e.g. lab, or lab,slurm-native).",
)
config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A site's own copy of alert_rules/config.yml [default: the package's].",
)


@click.group()
def rules() -> None:
    """slurmedic's Prometheus alert rules (alert_rules/)."""


@rules.command()
@profile_option
@config_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write the *.rules.yml files [default: the checkout's alert_rules/; "
    "required when slurmedic is installed from a wheel, or with --config].",
)
def render(profile: str | None, config_file: Path | None, out: Path | None) -> None:
    """Render the rule templates with the config's thresholds; list the files that changed."""
    if out is None:
        if resources.checkout() is None or config_file is not None:
            # An installed package's own files are not the operator's to edit, nor is the
            # checkout's rendering a site config's.
            raise click.UsageError("name a directory to write the rules into: --out DIR")
        out = RULES_DIR
    try:
        source = RuleSource(config_file=config_file)
        written = source.write_changed(out, profile)
        if profile is None and config_file is None and out.resolve() == RULES_DIR.resolve():
            written += [(p, True) for p in source.write_variants()]
    except RulesError as e:
        raise click.ClickException(str(e)) from e
    changed = [path for path, was_changed in written if was_changed]
    for path in changed:
        click.echo(f"changed {path}")
    click.echo(f"{len(changed)} changed, {len(written) - len(changed)} unchanged in {out}")
    left = strays(out, (path.name for path, _ in written if path.parent == out))
    if left:
        click.echo(
            f"warning: {out} also holds {', '.join(left)}, which this rendering does not "
            "produce (another profile's?); Prometheus loads it too: remove it",
            err=True,
        )


@rules.command()
@profile_option
@config_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="The directory of rendered rules to check [default: the checkout's alert_rules/].",
)
def check(profile: str | None, config_file: Path | None, out: Path | None) -> None:
    """Fail when the rendered rules differ from a fresh render of the config."""
    try:
        source = RuleSource(config_file=config_file)
        if out is None and config_file is None and profile is None:
            stale = source.stale()
        else:
            if out is None:
                raise click.UsageError("name the directory of rendered rules: --out DIR")
            stale = source.differs(out, profile)
    except RulesError as e:
        raise click.ClickException(str(e)) from e
    if stale:
        again = "slurmedic rules render" + (f" --config {config_file}" if config_file else "")
        again += f" --out {out}" if out else ""
        raise click.ClickException(
            f"{', '.join(stale)} differ from the templates and the config: run `{again}`"
        )
    click.echo("rendered rules are up to date")
