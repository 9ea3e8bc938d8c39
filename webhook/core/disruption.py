"""What a decision would disrupt, in GPUs: the trial report's measure of a wrong action.

- A drain takes its nodes' GPUs out of service (for as long as a human leaves them drained:
  unknown when it is decided, so no hours).
- A requeue or stop interrupts the job: the GPUs of its nodes (whole nodes: what training jobs
  hold), and the GPU-hours its attempt had run until it ended or, still running, until it was
  decided (what a needless stop throws away; a requeue loses the part since the last
  checkpoint, at most this).
Pure: the cluster view and the time are given.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from webhook.core.cluster import ClusterView, Job
from webhook.core.decisions import JOB_ACTIONS, Decision


def gpus_of(nodes: tuple[str, ...], view: ClusterView) -> int:
    return sum(view.nodes[n].gpus for n in nodes if n in view.nodes)


def with_disruption(d: Decision, job: Job | None, view: ClusterView, now: datetime) -> Decision:
    if d.action == "drain":
        return replace(d, gpus=gpus_of(d.nodes, view), gpu_hours=None)
    if d.action in JOB_ACTIONS and job is not None:
        gpus = gpus_of(job.nodes, view)
        ran = None
        if job.started is not None:
            # A job that already died ran until it ended, not until slurmedic decided.
            until = min(now, job.ended) if job.ended is not None else now
            ran = gpus * max(0.0, (until - job.started).total_seconds()) / 3600
        return replace(d, gpus=gpus, gpu_hours=ran)
    return d


def describe(action: str, gpus: int | None, gpu_hours: float | None) -> str:
    """One sentence for people (the incident page, `decisions show`); "" when nothing is known."""
    if not gpus:
        return ""
    what = f"{gpus} GPUs"
    if gpu_hours is not None:
        what += f", {gpu_hours:.1f} GPU-hours of the attempt so far"
    if action == "drain":
        what += " out of service until resumed"
    return f"disrupts: {what}"
