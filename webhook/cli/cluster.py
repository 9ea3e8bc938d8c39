"""`slurmedic cluster show [--json]`: the cluster as slurmedic sees it ("why did it not act?").

It reads Slurm through the same adapter and the same config (`cluster.slurm_conf`,
`cluster.slurm_bin`) as `serve`.
The JSON form is a public interface (docs/operations.md, The cluster view): keep it stable.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from webhook.adapters.slurm import SlurmError, SlurmSnapshot
from webhook.cli.common import config_option
from webhook.core.cluster import ClusterView
from webhook.service.config import ConfigError, load_config


@click.group()
def cluster() -> None:
    """The Slurm cluster as slurmedic reads it."""


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


JOB_COLUMNS = (
    "job",
    "name",
    "user",
    "partition",
    "state",
    "nodes",
    "excluded",
    "restarts",
    "requeue",
)


def as_json(snap: SlurmSnapshot, view: ClusterView) -> dict[str, Any]:
    return {
        "slurm_release": str(snap.release),
        "nodes": [
            {
                "name": n.name,
                "state": n.state,
                "partitions": list(n.partitions),
                "reason": n.reason,
                "switch": n.switch,
                "host": n.host,
            }
            for n in sorted(view.nodes.values(), key=lambda n: n.name)
        ],
        "jobs": [
            {
                "id": j.id,
                "name": j.name,
                "user": j.user,
                "partition": j.partition,
                "state": j.state,
                "nodes": list(j.nodes),
                "excluded": sorted(j.excluded),
                "restarts": j.restarts,
                "requeue": j.requeue,
                "comment": j.comment,
                "started": _iso(j.started),
                "ended": _iso(j.ended),
                "exit_code": j.exit_code,
            }
            for j in sorted(view.jobs.values(), key=lambda j: j.id)
        ],
    }


@cluster.command()
@config_option
@click.option("--json", "as_json_flag", is_flag=True, help="Print JSON (a stable interface).")
def show(config_path: Path | None, as_json_flag: bool) -> None:
    """Nodes (state, partitions, drain reason, leaf switch) and jobs (state, nodes, restarts)."""
    try:
        config = load_config(config_path)
        snap = config.cluster.reader().snapshot()
    except (ConfigError, SlurmError) as e:
        raise click.ClickException(str(e)) from e
    view = snap.view()
    if as_json_flag:
        click.echo(json.dumps(as_json(snap, view), indent=1))
        return
    console = Console()
    nodes = Table(title=f"nodes (Slurm {snap.release})")
    for col in ("node", "state", "partitions", "switch", "reason"):
        nodes.add_column(col)
    for n in sorted(view.nodes.values(), key=lambda n: n.name):
        nodes.add_row(n.name, n.state, ",".join(n.partitions), n.switch or "", n.reason)
    jobs = Table(title="jobs")
    for col in JOB_COLUMNS:
        jobs.add_column(col)
    for j in sorted(view.jobs.values(), key=lambda j: j.id):
        jobs.add_row(
            str(j.id),
            j.name,
            j.user,
            j.partition,
            j.state,
            ",".join(j.nodes),
            ",".join(sorted(j.excluded)),
            str(j.restarts),
            "yes" if j.requeue else "no",
        )
    console.print(nodes)
    console.print(jobs)
