"""`slurmedic simulate`: what recovery automation is worth on a cluster like yours, measured on
one simulated failure trace answered by no automation, a naive responder, slurmedic's real core
with your policy, and an oracle (webhook/simulate)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import click

from webhook.cli.common import policy_of, render_report
from webhook.core import durations
from webhook.rules.render import RuleSource
from webhook.simulate import report
from webhook.simulate.responders import COMPARED, POLICIES
from webhook.simulate.run import compare, sweep
from webhook.simulate.site import SiteError, delays, sim_config
from webhook.simulate.trace import draw


def _policies(value: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in value.split(",") if p.strip())
    bad = [p for p in names if p not in POLICIES]
    if bad or not names:
        raise click.BadParameter(
            f"{(bad or [value])[0]!r} is not one of {', '.join(POLICIES)}", param_hint="--policies"
        )
    return names


def _intervals(value: str) -> list[timedelta]:
    try:
        out = [durations.parse(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError as e:
        raise click.BadParameter(f"{value!r}: {e}", param_hint="--sweep") from None
    if not out or any(v <= timedelta(0) for v in out):
        raise click.BadParameter(f"{value!r}: give durations above 0", param_hint="--sweep")
    return sorted(out)


@click.command()
@click.option(
    "--cluster",
    "cluster_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A YAML file of the simulated cluster: nodes, leaf_nodes, jobs, rates, repair times, "
    "human delays (docs/simulate.md); the defaults are Llama 3's 16,384 GPUs.",
)
@click.option("--days", type=float, help="The simulated span (default 54).")
@click.option("--nodes", type=int, help="Nodes in the cluster (default 2,048).")
@click.option("--seed", type=int, help="The failure trace's seed (default 1).")
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="slurmedic's policy file (default: the defaults); its actions are all enforced.",
)
@click.option(
    "--policies",
    default=",".join(COMPARED),
    show_default=True,
    help=f"Which to run, of {', '.join(POLICIES)} (informed: the oracle's answer once the first "
    "alert of a failure arrives; slurmedic-norepair: slurmedic with its repair loop off).",
)
@click.option(
    "--rules-config",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The site's alert_rules/config.yml, for the rules' windows (default: slurmedic's).",
)
@click.option(
    "--alertmanager",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The site's alertmanager.yml, for its route to slurmedic (default: the example).",
)
@click.option(
    "--fabric-error",
    type=click.FloatRange(min=0),
    help="Seconds from a dead link or leaf switch to its jobs' NCCL error (NCCL's InfiniBand "
    "retries, about 9 s with its defaults); default: they wait out the collective timeout.",
)
@click.option(
    "--blips",
    type=click.IntRange(min=0),
    help="Shared blips over the span: each time, a dozen nodes over as many leaves stop "
    "responding at once and answer again a minute later, nothing broken (the cluster file's "
    "`blips:` sets their size and length; default 0).",
)
@click.option(
    "--sweep",
    "sweep_",
    help="Checkpoint intervals to compare too, e.g. 10m,30m,1h,2h (every job class's).",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    help="With --sweep: a PNG of ETTR against checkpoint interval per policy.",
)
@click.option("--format", "fmt", type=click.Choice(["md", "csv", "json"]), default="md")
def simulate(
    cluster_file: Path | None,
    days: float | None,
    nodes: int | None,
    seed: int | None,
    policy_path: Path | None,
    policies: str,
    rules_config: Path | None,
    alertmanager: Path | None,
    fabric_error: float | None,
    blips: int | None,
    sweep_: str | None,
    plot: Path | None,
    fmt: str,
) -> None:
    """Simulate a GPU cluster failing as published fleets do, answered by each policy on the
    same failure trace; print ETTR, the cluster's goodput, GPU-hours lost, nodes out of service,
    healthy nodes drained, needless stops and escalations per policy. slurmedic's decisions
    come from its real core."""
    names = _policies(policies)
    intervals = _intervals(sweep_) if sweep_ else []
    if plot is not None and not intervals:
        raise click.BadParameter("a plot needs --sweep", param_hint="--plot")
    policy = policy_of(policy_path)
    try:
        cfg = sim_config(cluster_file, days=days, nodes=nodes, seed=seed)
        if blips is not None:
            cfg = cfg.model_copy(update={"blips": cfg.blips.model_copy(update={"count": blips})})
        rules = RuleSource(config_file=rules_config) if rules_config else None
        waits = replace(delays(rules, alertmanager), fabric_error=fabric_error)
    except SiteError as e:
        raise click.ClickException(str(e)) from e
    if cfg.busy_nodes > cfg.nodes:
        raise click.BadParameter(
            f"the jobs need {cfg.busy_nodes} nodes, the cluster has {cfg.nodes}",
            param_hint="--nodes",
        )
    faults = draw(cfg)
    outcomes = compare(cfg, policy=policy, delays=waits, policies=names, faults=faults)
    swept = (
        sweep(cfg, intervals, policy=policy, delays=waits, policies=names, faults=faults)
        if intervals
        else {}
    )
    if plot is not None:
        from webhook.simulate.plot import ettr_plot

        minutes = [i.total_seconds() / 60 for i in intervals]
        ettr_plot(
            swept, minutes, plot, f"{cfg.nodes * cfg.gpus_per_node:,} GPUs, {cfg.days:g} days"
        )
    head = report.header(cfg, faults, str(policy_path or "the defaults"))
    text = render_report(
        fmt,
        lambda: {
            "config": json.loads(cfg.model_dump_json()),
            "outcomes": [o.to_json() for o in outcomes],
            "sweep": {k: [o.to_json() for o in v] for k, v in swept.items()},
        },
        lambda: report.rows(outcomes),
        lambda: (
            report.as_markdown(outcomes, head)
            + (("\n" + report.sweep_markdown(swept)) if swept else "")
        ),
    )
    click.echo(text, nl=False)
    took = ", ".join(f"{o.policy} {o.seconds:.1f} s" for o in outcomes)
    click.echo(f"run: {took}", err=True)
    if plot is not None:
        click.echo(f"plot: {plot}", err=True)
