"""`slurmedic backtest`: what slurmedic would have done over a past span, against what
operators actually did (webhook/backtest)."""

from __future__ import annotations

import getpass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import yaml

from webhook.adapters.accounting import Accounting
from webhook.adapters.prometheus import Prometheus
from webhook.adapters.slurm import SlurmCluster
from webhook.backtest import report as rendering
from webhook.backtest.compare import Report
from webhook.backtest.run import BacktestError, read, run
from webhook.cli.common import config_of, config_option, ledger_of, policy_of, render_report
from webhook.cli.trial import when
from webhook.core import durations
from webhook.files import FileError, load_mapping


def render(report: Report, fmt: str) -> str:
    return render_report(
        fmt,
        lambda: rendering.as_json(report),
        lambda: rendering.csv_rows(report),
        lambda: rendering.as_markdown(report),
    )


def _duration(value: str, name: str) -> timedelta:
    try:
        return durations.parse(value)
    except ValueError as e:
        raise click.BadParameter(f"{value!r}: {e}", param_hint=name) from None


@click.command()
@config_option
@click.option(
    "--prometheus",
    "prometheus_url",
    help="Prometheus that evaluated slurmedic's "
    "rules (default: the config's verification.prometheus_url).",
)
@click.option("--from", "from_", required=True, help="A duration back (30d) or an ISO time.")
@click.option("--to", "to", default=None, help="An ISO time or a duration back (default: now).")
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(path_type=Path),
    help="The policy to judge (default: the config's policy file, else the defaults).",
)
@click.option(
    "--delay",
    default="0s",
    show_default=True,
    help="From an alert firing to slurmedic receiving it (Alertmanager's group_wait).",
)
@click.option(
    "--window",
    default="24h",
    show_default=True,
    help="How long after a fault what people did still answers it.",
)
@click.option("--format", "fmt", type=click.Choice(["md", "csv", "json"]), default="md")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), help="Write it here.")
@click.option(
    "--save",
    is_flag=True,
    help="Also keep the report in the service's ledger, for the console's backtest pages.",
)
@click.option(
    "--scenario-out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the replay scenario the history made (slurmedic replay FILE).",
)
def backtest(
    config_path: Path | None,
    prometheus_url: str | None,
    from_: str,
    to: str | None,
    policy_path: Path | None,
    delay: str,
    window: str,
    fmt: str,
    out: Path | None,
    save: bool,
    scenario_out: Path | None,
) -> None:
    """Replay the alerts Prometheus kept and the jobs and node events Slurm accounting
    recorded through the real core, and compare each decision with what happened: who drained
    which node when and why, which jobs were requeued or resubmitted, which failed for good."""
    now = datetime.now(UTC)
    start = when(from_, "--from", now)
    until = when(to, "--to", now) if to else now
    if until <= start:
        raise click.BadParameter(f"{to!r} is not after --from", param_hint="--to")
    delay_, window_ = _duration(delay, "--delay"), _duration(window, "--window")
    cfg = config_of(config_path)
    url = prometheus_url or cfg.verification.prometheus_url
    if not url:
        raise click.BadParameter(
            "give the Prometheus to read alerts from", param_hint="--prometheus"
        )
    policy_file = policy_path or cfg.policy_file
    policy_of(policy_file)  # a bad policy is a one-line error naming the key, before any query
    try:
        policy = load_mapping(policy_file, "policy file") if policy_file else None
    except FileError as e:
        raise click.ClickException(str(e)) from e
    ledger = ledger_of(config_path) if save else None  # before the work, not after it
    env = cfg.cluster.slurm_env()
    try:
        inputs = read(
            Prometheus(url, timeout=60), Accounting(env), SlurmCluster(env=env), start, until, now
        )
        report, scenario = run(
            inputs,
            start=start,
            until=until,
            policy=policy,
            delay=delay_,
            window=window_,
        )
    except BacktestError as e:
        raise click.ClickException(str(e)) from e
    if ledger is not None:
        kept = ledger.save_backtest(
            rendering.as_json(report),
            at=datetime.now(UTC),
            by=getpass.getuser(),
            span=(start, until),
            policy=str(policy_file) if policy_file else "defaults",
        )
        click.echo(f"kept as backtest {kept} (the console's backtest pages)", err=True)
    if scenario_out is not None:
        scenario_out.write_text(yaml.safe_dump(scenario, sort_keys=False))
    text = render(report, fmt)
    if out is None:
        click.echo(text, nl=False)
        return
    out.write_text(text)
    c = report.counts()
    click.echo(
        f"{out}: {c['incidents']} incident(s), {c['agreed']} agreed, {c['misses']} miss(es), "
        f"{c['possible_false_positives']} possible false positive(s)"
    )
