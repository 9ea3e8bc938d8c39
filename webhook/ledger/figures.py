"""What /metrics reads from the ledger at scrape time, as plain values (no rows, no session)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

# Closed repairs and the times to return to service: those begun within the last week.
REPAIRS_WINDOW = timedelta(days=7)


@dataclass(frozen=True)
class DecisionCount:
    """How many decisions of one kind are in one state now."""

    action: str
    cause: str
    mode: str
    state: str
    n: int


@dataclass(frozen=True)
class Outcomes:
    """How many times decisions of one action reached one final state (executed, failed)."""

    action: str
    state: str
    n: int


@dataclass(frozen=True)
class Timing:
    """One of the engine's decisions: when its fault began, when it was decided, and when it
    was executed (None: not, or not yet)."""

    action: str
    fault_at: datetime
    decided_at: datetime
    executed_at: datetime | None


@dataclass(frozen=True)
class Recovery:
    state: str
    restored_seconds: float | None
    work_lost_seconds: float | None


@dataclass(frozen=True)
class VerdictCount:
    """How many decisions of one action have this as their operator's latest verdict."""

    action: str
    verdict: str
    n: int


@dataclass(frozen=True)
class Mismatches:
    """How many decisions of one action Slurm showed otherwise after their run."""

    action: str
    n: int


@dataclass(frozen=True)
class RepairFigures:
    """The repairs of nodes slurmedic drained (webhook/ledger/repairs.py, `Repairs.figures`)."""

    # (state, plan, the drain's cause): how many; every repair under way, the closed ones begun
    # in the window.
    by_state: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # Seconds from the drain to the node back in service (its resume executed), of the repairs
    # begun in the window that got there.
    returned: list[float] = field(default_factory=list)
    # The nodes whose latest repair sent them to a person for replacement.
    replace: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Figures:
    decisions: list[DecisionCount]
    outcomes: list[Outcomes]
    timings: list[Timing]
    recoveries: list[Recovery]  # real ones: drills are apart
    waiting_since: list[datetime]  # when each decision awaiting approval was decided
    verdicts: list[VerdictCount]
    open_escalations: int  # escalations nobody has recorded a verdict on
    mismatches: list[Mismatches]
    # Drills by outcome: asked (not planned yet), refused, watching, passed, failed, unverified.
    drills: dict[str, int] = field(default_factory=dict)
    repairs: RepairFigures = field(default_factory=RepairFigures)
