"""`slurmedic decisions list | show`: what slurmedic decided, why, on what evidence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from webhook.cli.common import config_option, decision_table, ledger_of
from webhook.core.disruption import describe
from webhook.ledger.schema import DecisionRow


def _json(row: DecisionRow) -> dict[str, object]:
    return {
        "id": row.id,
        "at": row.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "incident": row.incident,
        "job": row.job,
        "action": row.action,
        "nodes": row.nodes,
        "exclude": row.exclude,
        "cause": row.cause,
        "reason": row.reason,
        "evidence": row.evidence,
        "guard": row.guard,
        "mode": row.mode,
        "state": row.state,
        "partition": row.partition,
        "gpus": row.gpus,
        "gpu_hours": row.gpu_hours,
        "mismatch": row.mismatch,
    }


@click.group()
def decisions() -> None:
    """Decisions in the ledger."""


@decisions.command(name="list")
@config_option
@click.option("--json", "as_json", is_flag=True)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1))
def list_(config_path: Path | None, as_json: bool, limit: int) -> None:
    """The most recent decisions, newest first."""
    rows = ledger_of(config_path).decisions(limit)
    if as_json:
        click.echo(json.dumps([_json(r) for r in rows], indent=1))
        return
    t = decision_table("slurmedic decisions", rows)
    Console().print(t)


@decisions.command()
@config_option
@click.argument("decision_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def show(config_path: Path | None, decision_id: int, as_json: bool) -> None:
    """One decision: its reason, evidence and every state it went through."""
    found = ledger_of(config_path).decision(decision_id)
    if found is None:
        raise click.ClickException(f"decision {decision_id} is not in the ledger")
    row, events = found
    data = _json(row) | {
        "events": [
            {"at": e.at.strftime("%Y-%m-%dT%H:%M:%SZ"), "state": e.state, "detail": e.detail}
            for e in events
        ]
    }
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    c = Console()
    c.print(
        f"[bold]decision {row.id}[/bold]  {row.action} {', '.join(row.nodes or row.exclude)}"
        f"  ({row.cause}, {row.mode}, {row.state})"
    )
    c.print(f"incident {row.incident}  job {row.job}  at {data['at']}  guard {row.guard or '-'}")
    c.print(f"reason: {row.reason}")
    if row.mismatch:
        c.print(f"[bold red]Slurm after the run:[/bold red] {row.mismatch}", highlight=False)
    if disrupts := describe(row.action, row.gpus, row.gpu_hours):
        c.print(disrupts)
    t = Table(title="evidence")
    for col in ("alertname", "node", "startsAt", "fingerprint"):
        t.add_column(col)
    for e in row.evidence:
        t.add_row(
            e.get("alertname", ""),
            e.get("node") or "",
            e.get("startsAt", ""),
            e.get("fingerprint", ""),
        )
    c.print(t)
    c.print("history:")
    for e in events:
        run = e.detail.get("dry_run") or e.detail.get("run")
        who = e.detail.get("by", "")
        extra = "".join(f" ({e.detail[k]})" for k in ("reason", "note") if k in e.detail)
        c.print(f"  {e.at.strftime('%Y-%m-%dT%H:%M:%SZ')}  {e.state:18} by {who}{extra}")
        if run:
            kind = "would run (check mode)" if e.detail.get("dry_run") else "ran"
            c.print(f"    {run['playbook']}: {run['status']}; {kind}:")
            for cmd in run["commands"] or ["(nothing: already done)"]:
                c.print(f"      {cmd}", markup=False, highlight=False, soft_wrap=True)
        elif "error" in e.detail:
            c.print(f"    error: {e.detail['error']}")
        if "diagnostics" in e.detail:
            _print_diagnostics(c, e.detail["diagnostics"])


def _print_diagnostics(c: Console, diag: dict[str, Any]) -> None:
    if "error" in diag:
        c.print(f"    diagnostics failed: {diag['error']}", markup=False)
        return
    for node, d in sorted(diag.get("nodes", {}).items()):
        where = "unreachable" if d.get("unreachable") else d.get("artifacts", "")
        c.print(f"    diagnostics {node}: {d.get('verdict', 'unknown')}  {where}", markup=False)
        # The node line and every problem, then the GPUs' lines as room allows: on an
        # eight-GPU node the problems come after a dozen lines.
        summary = [str(line) for line in d.get("summary", [])]
        said = ("- ", "nvidia-smi:")  # the problems, and what nvidia-smi said on stderr
        first = summary[:1] + [ln for ln in summary[1:] if ln.startswith(said)]
        rest = [ln for ln in summary[1:] if not ln.startswith(said)]
        for line in first + rest[: max(0, 12 - len(first))]:
            c.print(f"      {line}", markup=False, highlight=False)
