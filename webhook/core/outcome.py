"""Whether an action did in Slurm what it was decided to do, once it has run (pure).

A playbook reports Slurm's state as it read it before its commands and once they were done
(webhook/executor/runner.py, RunResult.before/after). After a requeue Slurm must count one
restart more than the attempt the decision was made about: more means the job was requeued
again (a paused leader's stale requeue, a person's), fewer that the requeue did not take.
After a drain each node the run drained must show this drain's reason: another means someone
changed it at once, or that the drain overwrote a reason set between the read and the act.
A mismatch is recorded on the decision and escalated (a person looks); nothing is undone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def requeue_mismatch(job: int, attempt: int, after: Mapping[str, Any]) -> str | None:
    restarts = str(after.get("Restarts", ""))
    if not restarts.isascii() or not restarts.isdigit():
        return None  # the job is gone (purged): nothing to compare
    n = int(restarts)
    if n == attempt + 1:
        return None
    what = "requeued more than once" if n > attempt + 1 else "not requeued"
    return (
        f"Slurm counts {n} restarts of job {job} after the requeue of attempt {attempt} "
        f"(expected {attempt + 1}): {what}"
    )


def drain_mismatch(
    nodes: Sequence[str], reason: str, before: Mapping[str, Any], after: Mapping[str, Any]
) -> str | None:
    """`before`: each node's state as the plan read it; `after`: {"State": {node: state},
    "Reason": {node: reason}} once done. Nodes already draining before were left alone on
    purpose (a person's reason is kept): only the ones this run drained are checked."""
    states, reasons = after.get("State", {}), after.get("Reason", {})
    if not isinstance(states, Mapping) or not isinstance(reasons, Mapping):
        return None
    wrong = []
    for node in nodes:
        if "DRAIN" in str(before.get(node, "")):
            continue
        state, why = str(states.get(node, "")), str(reasons.get(node, ""))
        if "DRAIN" not in state or not why.startswith(reason):
            wrong.append(f"{node} is {state or 'unknown'} with reason {why or '(none)'!r}")
    if not wrong:
        return None
    return f"after the drain ({reason!r}): " + "; ".join(wrong)
