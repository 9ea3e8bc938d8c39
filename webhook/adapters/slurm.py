"""The cluster view from the real Slurm: `sinfo --json`, `squeue --json`, `scontrol show topology`.

Slurm 22.05: scontrol has no --json. Every call has a timeout; the caller keeps its last good
view when Slurm does not answer.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hostlist

from webhook.core.cluster import ENDED_STATES, NODE_NAME, ClusterView, Job, Node

TIMEOUT_S = 10.0


class SlurmError(RuntimeError):
    pass


class SlurmCluster:
    def __init__(self, slurm_conf: Path | None = None) -> None:
        self.env = dict(os.environ)
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = str(slurm_conf)

    def _run(self, *argv: str) -> str:
        try:
            out = subprocess.run(
                list(argv),
                env=self.env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"{argv[0]}: {e}") from e
        if out.returncode != 0:
            raise SlurmError(f"{' '.join(argv)}: {out.stderr.strip()[:200]}")
        return out.stdout

    def view(self) -> ClusterView:
        nodes = json.loads(self._run("sinfo", "--json"))["nodes"]
        # Ended jobs too (while slurmctld remembers them): an alert may arrive after Slurm
        # already ended the job it concerns.
        jobs = json.loads(self._run("squeue", "--json", "--states=all"))["jobs"]
        topology = self._run("scontrol", "show", "topology")
        return build_view(nodes, jobs, topology)


def _expand(expr: str) -> tuple[str, ...]:
    return tuple(hostlist.expand_hostlist(expr)) if expr else ()


def parse_topology(text: str) -> dict[str, tuple[str, ...]]:
    """Leaf switches (those with Nodes=) of `scontrol show topology`."""
    switches = {}
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "SwitchName" in fields and fields.get("Nodes"):
            switches[fields["SwitchName"]] = _expand(fields["Nodes"])
    return switches


def build_view(
    nodes: list[dict[str, Any]], jobs: list[dict[str, Any]], topology: str
) -> ClusterView:
    switches = parse_topology(topology)
    switch_of = {n: s for s, members in switches.items() for n in members}
    view = ClusterView(switches=switches)
    for n in nodes:
        name = str(n.get("name", ""))
        if not NODE_NAME.match(name):
            continue
        flags = n.get("state_flags") or []
        state = "drain" if "DRAIN" in flags else str(n.get("state", "")).lower()
        parts = n.get("partitions") or [""]
        view.nodes[name] = Node(
            name,
            parts[0],
            state,
            str(n.get("reason", "")),
            switch_of.get(name),
            other_partitions=tuple(parts[1:]),
        )
    for j in jobs:
        started = j.get("start_time") or 0
        state = str(j.get("job_state", ""))
        # end_time of a running job is its time limit; only an ended job's is when it ended.
        ended = j.get("end_time") or 0 if state in ENDED_STATES else 0
        view.set_job(
            Job(
                id=int(j["job_id"]),
                nodes=_expand(str(j.get("nodes") or "")),
                partition=str(j.get("partition", "")),
                name=str(j.get("name", "")),
                user=str(j.get("user_name", "")),
                state=state,
                requeue=bool(j.get("requeue", True)),
                restarts=int(j.get("restart_cnt", 0)),
                comment=str(j.get("comment", "")),
                started=datetime.fromtimestamp(started, UTC) if started else None,
                ended=datetime.fromtimestamp(ended, UTC) if ended else None,
            )
        )
    return view
