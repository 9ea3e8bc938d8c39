"""What a decision changes in Slurm, from its run's record: the state each playbook read
(`before`) and the commands it ran or would run, as (what, before, after) rows for a human.

Pure over the run summary the ledger keeps (webhook/executor/runner.py: `commands`, `before`).
Nothing here guesses: a row is only shown when the playbook read the state, and `after` is
what the commands do to it ("unchanged" when nothing is to run).
"""

from __future__ import annotations

import re
from typing import Any

from webhook.core.validation import is_number

Change = tuple[str, str, str]  # what, before, after
_EXCLUDE = re.compile(r"ExcNodeList=(\S+)")
_NODES = re.compile(r"nodename=(\S+)")


def changes(action: str, reason: str, run: dict[str, Any]) -> list[Change]:
    before = run.get("before")
    if not isinstance(before, dict) or not before:
        return []
    commands = [str(c) for c in run.get("commands", [])]
    if action == "drain":
        named = {n for c in commands for m in _NODES.finditer(c) for n in m.group(1).split(",")}
        return [
            (f"node {node}", str(state), f"DRAIN ({reason})" if node in named else "unchanged")
            for node, state in sorted(before.items())
        ]
    job_state = str(before.get("JobState", "?"))
    if action == "requeue":
        held = any(c.startswith("scontrol requeuehold") for c in commands)
        excl = next((m.group(1) for c in commands if (m := _EXCLUDE.search(c))), None)
        rows: list[Change] = []
        if held:
            restarts = str(before.get("Restarts", "?"))
            nxt = str(int(restarts) + 1) if is_number(restarts) else "next"
            rows.append(("job state", job_state, f"PENDING (requeued: attempt {nxt})"))
        rows.append(("ExcNodeList", str(before.get("ExcNodeList", "(null)")), excl or "unchanged"))
        return rows
    if action == "stop":
        return [("job state", job_state, "CANCELLED" if commands else "unchanged")]
    return []
