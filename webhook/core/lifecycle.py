"""The life of a decision: its states and the moves between them, in one table.

    recorded           monitor mode: kept with its dry run; nothing is carried out
    awaiting_approval  approve mode: waits for a human
    pending            enforce mode: waits for the executor
    approved           a human said yes: waits for the executor
    running            the executor is carrying it out
    executed / failed  carried out, or tried and failed
    rejected           a human said no
    superseded         later evidence changed the decision before it was carried out

The ledger checks every state it writes against TRANSITIONS: a move that is not in the table is
an error (IllegalTransition), never a row. `note` is not a state: it records something learnt
about a decision (diagnostics) without moving it.
"""

from __future__ import annotations

from typing import Literal

State = Literal[
    "recorded",
    "awaiting_approval",
    "pending",
    "approved",
    "running",
    "executed",
    "failed",
    "rejected",
    "superseded",
]
NOTE = "note"

# The state a decision starts in, by the mode of its action.
INITIAL: dict[str, State] = {
    "monitor": "recorded",
    "approve": "awaiting_approval",
    "enforce": "pending",
}

TRANSITIONS: dict[str, frozenset[str]] = {
    # A dry run (or the global switch's) is recorded on the decision again.
    "recorded": frozenset({"recorded", "superseded"}),
    # The global switch to monitor turns a waiting decision into a dry run; a dry run may be
    # recorded while it waits.
    "awaiting_approval": frozenset(
        {"awaiting_approval", "approved", "rejected", "recorded", "superseded"}
    ),
    "pending": frozenset({"running", "executed", "failed", "recorded", "superseded"}),
    "approved": frozenset({"running", "executed", "failed", "recorded", "superseded"}),
    # A run a crash interrupted is run again (the playbooks are idempotent).
    "running": frozenset({"running", "executed", "failed"}),
    "executed": frozenset(),
    "failed": frozenset(),
    "rejected": frozenset(),
    "superseded": frozenset(),
}
STATES = frozenset(TRANSITIONS)
# The states each state may be reached from.
PREVIOUS: dict[str, frozenset[str]] = {
    new: frozenset(old for old, nexts in TRANSITIONS.items() if new in nexts) for new in STATES
}
# Not yet carried out: what later evidence may still supersede.
OPEN = frozenset({"recorded", "awaiting_approval", "pending", "approved"})
# Carried out, or being carried out.
CARRIED_OUT = frozenset({"running", "executed", "failed"})


class IllegalTransition(ValueError):
    """A state change the lifecycle does not allow."""


def check(current: str, new: str) -> None:
    if new not in STATES:
        raise IllegalTransition(f"{new!r} is not a decision state")
    if new not in TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(f"a {current} decision cannot become {new}")
