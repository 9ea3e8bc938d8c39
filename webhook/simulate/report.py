"""`slurmedic simulate`'s report: one row a policy (and a table of ETTR by checkpoint interval),
as markdown, csv or json. Pure: outcomes in, text out."""

from __future__ import annotations

from collections import Counter
from typing import Any

from webhook.simulate.model import SimConfig
from webhook.simulate.run import Outcome
from webhook.simulate.trace import Fault

COLUMNS = (
    ("policy", "policy"),
    ("ettr_cluster", "ETTR (cluster)"),
    ("ettr_largest", "ETTR (largest job)"),
    ("goodput_cluster", "cluster goodput"),
    ("gpu_hours_lost", "GPU-hours lost"),
    ("out_mean", "nodes out (mean)"),
    ("out_peak", "nodes out (peak)"),
    ("out_node_hours", "node-hours out"),
    ("healthy_drained", "healthy nodes drained"),
    ("needless_stops", "jobs stopped needlessly"),
    ("needless_requeues", "jobs requeued needlessly"),
    ("escalations", "escalations"),
    ("drains", "drains"),
    ("requeues", "requeues"),
    ("stops", "stops"),
    ("repairs", "resets and reboots"),
    ("repaired", "nodes repaired"),
    ("replaced", "nodes to replace"),
    ("owner_restarts", "restarted by their owner"),
    ("alerts", "alerts"),
    ("decisions", "core decisions"),
)


def _cell(key: str, value: Any) -> str:
    if key.startswith(("ettr", "goodput")):
        return f"{value:.4f}"
    if key == "out_mean":
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def trace_line(faults: list[Fault]) -> str:
    kinds = Counter(f.kind for f in faults)
    return f"{len(faults)} failures (" + ", ".join(f"{k} {n}" for k, n in kinds.items()) + ")"


def header(cfg: SimConfig, faults: list[Fault], policy: str) -> str:
    gpus = cfg.nodes * cfg.gpus_per_node
    jobs = ", ".join(
        f"{c.count} x {c.name} ({c.nodes} nodes, checkpoint every {c.checkpoint_every})"
        for c in cfg.jobs
    )
    return (
        f"# Goodput simulation: {cfg.days:g} days, {cfg.nodes:,} nodes x {cfg.gpus_per_node} GPUs "
        f"({gpus:,}), seed {cfg.seed}\n\n"
        f"- jobs: {jobs}\n"
        f"- trace: {trace_line(faults)}\n"
        f"- slurmedic's policy: {policy}, every action enforced\n"
        f"- people answer in {cfg.human.median} (median), {cfg.human.p90} (90th percentile)\n"
    )


def as_markdown(outcomes: list[Outcome], head: str) -> str:
    names = [title for _, title in COLUMNS]
    lines = [head, "| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for o in outcomes:
        row = o.to_json()
        lines.append("| " + " | ".join(_cell(k, row[k]) for k, _ in COLUMNS) + " |")
    lines += ["", *lost_markdown(outcomes), *blips_markdown(outcomes)]
    for o in outcomes:
        if o.guards:
            said = ", ".join(f"{g} {n}" for g, n in o.guards.items())
            lines.append(f"\n{o.policy}: decisions a guard changed: {said}")
    return "\n".join(lines) + "\n"


def lost_markdown(outcomes: list[Outcome]) -> list[str]:
    """GPU-hours lost by the kind of fault that caused them, one column a policy."""
    kinds = sorted({k for o in outcomes for k in o.lost_by_kind})
    lines = [
        "GPU-hours lost, by what caused the loss (a fault's kind: the work its attempts did not"
        " save, their restarts and the waits until the next start; start: the wait for a first"
        " start; needless: attempts requeued or stopped with nothing wrong)",
        "",
        "| cause | " + " | ".join(o.policy for o in outcomes) + " |",
        "|" + "---|" * (len(outcomes) + 1),
    ]
    for k in kinds:
        cells = " | ".join(f"{o.lost_by_kind.get(k, 0.0):,.0f}" for o in outcomes)
        lines.append(f"| {k} | {cells} |")
    return lines


def blips_markdown(outcomes: list[Outcome]) -> list[str]:
    """What each policy did for the blips (none unless the config has them): the healthy nodes
    a blip hit that it drained, and the jobs on them it requeued with nothing wrong."""
    if not any(o.tally.blips for o in outcomes):
        return []
    t = outcomes[0].tally
    lines = [
        "",
        f"Blips: {t.blips}, {t.blips_seen} seen by Slurm (a ping fell within: its nodes shown "
        "not responding, SlurmNodeDown for those that run a job); what each policy did for them "
        "within the hour after",
        "",
        "| policy | healthy nodes drained | jobs requeued with nothing wrong |",
        "|---|---|---|",
    ]
    lines += [
        f"| {o.policy} | {o.tally.blip_drained:,} | {o.tally.blip_requeues:,} |" for o in outcomes
    ]
    return lines


def rows(outcomes: list[Outcome]) -> list[list[Any]]:
    out: list[list[Any]] = [[k for k, _ in COLUMNS]]
    out += [[o.to_json()[k] for k, _ in COLUMNS] for o in outcomes]
    return out


def sweep_markdown(sweep: dict[str, list[Outcome]]) -> str:
    """ETTR (cluster) by checkpoint interval, one column a policy."""
    policies = [o.policy for o in next(iter(sweep.values()))]
    lines = [
        "## ETTR (cluster) by checkpoint interval",
        "",
        "| checkpoint every | " + " | ".join(policies) + " |",
        "|" + "---|" * (len(policies) + 1),
    ]
    for every, outcomes in sweep.items():
        lines.append(f"| {every} | " + " | ".join(f"{o.ettr_cluster:.4f}" for o in outcomes) + " |")
    return "\n".join(lines) + "\n"
