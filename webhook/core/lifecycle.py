"""The life of a decision: its states and the moves between them, in one table.

    recorded           monitor mode: kept with its dry run; nothing is carried out
    awaiting_approval  approve mode: a scheduler action waits for a human
    pending            enforce mode (and an escalation in approve mode): waits for the executor
    approved           a human said yes: waits for the executor
    running            the executor is carrying it out
    executed / failed  carried out, or tried and failed
    rejected           a human said no
    expired            nobody approved it within the policy's `approval_expires`
    superseded         later evidence changed the decision before it was carried out

The ledger checks every state it writes against TRANSITIONS: a move that is not in the table is
an error (IllegalTransition), never a row. `note` is not a state: it records something learnt
about a decision (diagnostics) without moving it.
"""

from __future__ import annotations

from typing import Final, Literal

State = Literal[
    "recorded",
    "awaiting_approval",
    "pending",
    "approved",
    "running",
    "executed",
    "failed",
    "rejected",
    "expired",
    "superseded",
]
# The states by name: everything outside this module spells a state through these.
RECORDED: Final = "recorded"
AWAITING_APPROVAL: Final = "awaiting_approval"
PENDING: Final = "pending"
APPROVED: Final = "approved"
RUNNING: Final = "running"
EXECUTED: Final = "executed"
FAILED: Final = "failed"
REJECTED: Final = "rejected"
EXPIRED: Final = "expired"
SUPERSEDED: Final = "superseded"
NOTE: Final = "note"

# The state a decision starts in, by the mode of its action (decisions.initial_state applies
# it: `none` is always recorded, and an escalation never waits for approval).
INITIAL: dict[str, State] = {
    "monitor": RECORDED,
    "approve": AWAITING_APPROVAL,
    "enforce": PENDING,
}

TRANSITIONS: dict[str, frozenset[str]] = {
    # A dry run (or the global switch's) is recorded on the decision again.
    RECORDED: frozenset({RECORDED, SUPERSEDED}),
    # The global switch to monitor turns a waiting decision into a dry run; a dry run may be
    # recorded while it waits.
    # Unapproved for too long, it expires: the view it was decided on has moved on.
    AWAITING_APPROVAL: frozenset(
        {AWAITING_APPROVAL, APPROVED, REJECTED, EXPIRED, RECORDED, SUPERSEDED}
    ),
    PENDING: frozenset({RUNNING, EXECUTED, FAILED, RECORDED, SUPERSEDED}),
    APPROVED: frozenset({RUNNING, EXECUTED, FAILED, RECORDED, SUPERSEDED}),
    # A run a crash interrupted is run again (the playbooks are idempotent).
    RUNNING: frozenset({RUNNING, EXECUTED, FAILED}),
    EXECUTED: frozenset(),
    FAILED: frozenset(),
    REJECTED: frozenset(),
    EXPIRED: frozenset(),
    SUPERSEDED: frozenset(),
}
STATES = frozenset(TRANSITIONS)
# The states each state may be reached from.
PREVIOUS: dict[str, frozenset[str]] = {
    new: frozenset(old for old, nexts in TRANSITIONS.items() if new in nexts) for new in STATES
}
# Not yet carried out: what later evidence may still supersede.
OPEN = frozenset({RECORDED, AWAITING_APPROVAL, PENDING, APPROVED})
# Carried out, or being carried out.
CARRIED_OUT = frozenset({RUNNING, EXECUTED, FAILED})
# Never carried out, by a human's no or for want of a yes: the guards stop counting them (a
# rejected drain against the breaker, a requeue nobody approved against the job's budget).
REFUSED = frozenset({REJECTED, EXPIRED})
# Waiting for the executor or a human, or being carried out: not decided yet.
WAITING = frozenset({PENDING, AWAITING_APPROVAL, APPROVED, RUNNING})
# Work the executor picks up: enforce decisions, approved ones, runs a crash interrupted.
EXECUTABLE = (PENDING, APPROVED, RUNNING)
# Decided into these, a decision gets its check-mode dry run at once: monitor's record, and what
# the approver reads before approving.
DRY_RUN_FIRST = frozenset({RECORDED, AWAITING_APPROVAL})


class IllegalTransition(ValueError):
    """A state change the lifecycle does not allow."""


def check(current: str, new: str) -> None:
    if new not in STATES:
        raise IllegalTransition(f"{new!r} is not a decision state")
    if new not in TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(f"a {current} decision cannot become {new}")
