"""`slurmedic trial report`: the trial's record, per cause and action, with readiness lines."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from webhook.adapters.prometheus import Prometheus
from webhook.cli.common import config_of, config_option, ledger_of, render_report
from webhook.core import durations, trial
from webhook.ledger.review import trial_rows
from webhook.rules.delays import delays_for, rule_delays
from webhook.rules.render import RulesError, RuleSource


def when(value: str, name: str, now: datetime) -> datetime:
    """A duration back from now (`7d`, `36h`) or an ISO time (UTC when it names no zone)."""
    try:
        return now - durations.parse(value)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a duration (7d, 36h) nor an ISO time", param_hint=name
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def render(report: trial.Report, fmt: str) -> str:
    return render_report(
        fmt,
        lambda: trial.as_json(report),
        lambda: trial.csv_rows(report),
        lambda: trial.as_markdown(report),
    )


@click.group(name="trial")
def trial_group() -> None:
    """The trial: how the recommendations compare with what operators would do."""


@trial_group.command()
@config_option
@click.option("--since", default="7d", show_default=True, help="A duration back or an ISO time.")
@click.option("--until", "until_", default=None, help="An ISO time (default: now).")
@click.option("--format", "fmt", type=click.Choice(["md", "csv", "json"]), default="md")
@click.option(
    "--min-agreed",
    type=click.IntRange(1),
    default=trial.MIN_AGREED,
    show_default=True,
    help="Agreed recommendations an action needs (for a cause, on a partition) before it is ready.",
)
@click.option(
    "--rules-config",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A rules config (`rules render --config`) whose rules' for: are the delays added to "
    "alert-to-recommendation times (default: the rules Prometheus evaluates, read from "
    "verification.prometheus_url; without it, the shipped rules').",
)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), help="Write it here.")
def report(
    config_path: Path | None,
    since: str,
    until_: str | None,
    fmt: str,
    min_agreed: int,
    rules_config: Path | None,
    out: Path | None,
) -> None:
    """The trial report: recommendations, verdicts, agreement, disagreements with the
    operator's alternative, what would have been disrupted, fault to recommendation time,
    recovery outcomes, and a readiness line per action, cause and partition; then the recovery
    drills asked for in the window (apart: never counted above), each with the work it lost,
    its time to resume and whether it passed. In csv, the drills are a second table after an
    empty line."""
    now = datetime.now(UTC)
    start = when(since, "--since", now)
    end = when(until_, "--until", now) if until_ else now
    if end <= start:
        raise click.BadParameter(f"{until_!r} is not after --since", param_hint="--until")
    ledger = ledger_of(config_path)
    rows = trial_rows(ledger, start, end)
    drilled = [d.as_trial() for d in ledger.drills.between(start, end)]
    if rules_config is not None:
        try:
            delays, source = rule_delays(RuleSource(config_file=rules_config)), str(rules_config)
        except RulesError as e:
            raise click.BadParameter(str(e), param_hint="--rules-config") from e
    else:
        url = config_of(config_path).verification.prometheus_url
        delays, source = delays_for(Prometheus(url, timeout=10) if url else None)
    made = trial.report(rows, start, end, min_agreed, drilled, delays, source)
    text = render(made, fmt)
    if out is None:
        click.echo(text, nl=False)
        return
    out.write_text(text)
    click.echo(f"{out}: {made.recommendations} recommendation(s), {len(made.drills)} drill(s)")
