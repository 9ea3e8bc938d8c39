"""`slurmedic files export DIR`: the files slurmedic ships, written out for a site to review,
keep under version control and deploy: the rules (templates, config, renderings, promtool
tests, mtail programs, the Alertmanager example), dashboards, playbooks, inventory, runbooks
and the deployment examples.

With `--rules-config`, the rules are the site's: rendered with its config, and the promtool
tests made to expect its `runbook_base` (a test of a threshold the site changed still fails,
saying where the edge moved: docs/rules.md).
"""

from __future__ import annotations

from pathlib import Path

import click

from webhook import resources
from webhook.rules.render import RulesError, RuleSource

SKIP = ("__pycache__", ".pyc")


def shipped_files() -> dict[str, Path]:
    """Every shipped file, by its path under the export directory."""
    found: dict[str, Path] = {}
    for name, folder in resources.SHIPPED.items():
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not any(s in str(path) for s in SKIP):
                found[f"{name}/{path.relative_to(folder)}"] = path
    return found


def site_rules(config: Path, profile: str | None) -> dict[str, str]:
    """The rule files, their renderings beside the tests and the tests as the site's config
    gives them, by path under the export directory; RulesError naming what is wrong."""
    shipped, site = RuleSource(), RuleSource(config_file=config)
    base_of = {s: s.config()["runbook_base"] for s in (shipped, site)}
    out = {f"alert_rules/{name}": text for name, text in site.render(profile).items()}
    for variant, files in site.variants(site.render()).items():
        out |= {f"alert_rules/tests/{variant}/{name}": text for name, text in files.items()}
    for test in sorted((resources.ALERT_RULES / "tests").glob("*.test.yml")):
        text = test.read_text().replace(base_of[shipped], base_of[site])
        out[f"alert_rules/tests/{test.name}"] = text
    out["alert_rules/config.yml"] = config.read_text()
    return out


@click.group()
def files() -> None:
    """The files slurmedic ships (rules, dashboards, playbooks, runbooks, examples)."""


@files.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--rules-config",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The site's rules config: rules rendered with it, tests expecting its runbook_base.",
)
@click.option("--profile", help="Rendering profile(s) for the rules, e.g. scale,global.")
@click.option("--force", is_flag=True, help="Overwrite files that differ from the shipped ones.")
def export(directory: Path, rules_config: Path | None, profile: str | None, force: bool) -> None:
    """Write the shipped files into DIRECTORY (made if missing). A file there that differs is
    left alone, and named, unless --force."""
    texts: dict[str, bytes] = {k: p.read_bytes() for k, p in shipped_files().items()}
    if rules_config is not None or profile:
        try:
            given = rules_config or resources.ALERT_RULES / "config.yml"
            texts |= {k: v.encode() for k, v in site_rules(given, profile).items()}
        except RulesError as e:
            raise click.ClickException(str(e)) from e
    written = same = 0
    kept: list[str] = []
    for rel, data in sorted(texts.items()):
        target = directory / rel
        if target.exists() and target.read_bytes() == data:
            same += 1
            continue
        if target.exists() and not force:
            kept.append(rel)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written += 1
    for rel in kept:
        why = "it differs from what export writes (--force)"
        click.echo(f"kept {directory / rel}: {why}", err=True)
    click.echo(f"{written} written, {same} unchanged, {len(kept)} kept in {directory}")
    if kept:
        raise SystemExit(1)
