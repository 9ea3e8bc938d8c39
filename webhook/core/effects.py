"""What a requeue or stop actually did to the attempt it was decided about (pure).

The trial report counts a wrong action by what it disrupted. A stop of an attempt that had
already ended (failed, or ending: COMPLETING) disrupted nothing: its GPUs were idle already,
and what it cost was at most a restart not made. A requeue of a job Slurm had already requeued
by itself (NODE_FAIL of a --requeue job) only added an exclusion to the waiting successor. The
job as the decision's playbook read it before its commands (webhook/executor/runner.py,
RunResult.before: JobState, Restarts) says which: the first real run's, else the first dry
run's (monitor mode: what it would have found).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from webhook.core.decisions import JOB_ACTIONS
from webhook.core.validation import is_number

Effect = Literal["interrupted", "ended", "requeued"]
INTERRUPTED: Effect = "interrupted"  # the attempt was live: the action ended or restarted it
ENDED: Effect = "ended"  # the attempt had already ended (or was ending) when the run read it
REQUEUED: Effect = "requeued"  # Slurm (or a person) had already requeued the attempt
# The effects by which the action disrupted no running work.
HARMLESS: frozenset[str] = frozenset({ENDED, REQUEUED})
# An attempt Slurm still holds or runs (as playbooks/stop_job.yml reads it).
LIVE = frozenset({"RUNNING", "PENDING", "CONFIGURING", "SUSPENDED", "REQUEUE_HOLD"})


def effect(action: str, attempt: int, before: Mapping[str, Any]) -> Effect | None:
    """None: not a job action, or its run read nothing (a run before `before` was recorded)."""
    if action not in JOB_ACTIONS or not before:
        return None
    state, restarts = str(before.get("JobState", "")), str(before.get("Restarts", ""))
    if state == "GONE":  # purged from slurmctld: long over
        return ENDED
    if not is_number(restarts):
        return None
    if int(restarts) > attempt:
        return REQUEUED
    return INTERRUPTED if state in LIVE else ENDED


def first_before(details: Iterable[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The job as read before the first real run of a decision (from its events' details, in
    order), else before its first dry run; {} when no run read it."""
    dry: Mapping[str, Any] = {}
    for d in details:
        run = d.get("run")
        if isinstance(run, Mapping) and isinstance(run.get("before"), Mapping):
            return run["before"]  # type: ignore[no-any-return]
        plan = d.get("dry_run")
        if not dry and isinstance(plan, Mapping) and isinstance(plan.get("before"), Mapping):
            dry = plan["before"]
    return dry
