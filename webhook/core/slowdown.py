"""A slow job's requeue, weighed against its checkpoint (sans-I/O).

A job that runs slow (a straggler, a throttled GPU, a degraded node's rank) is moved off the slow
node by a requeue, which throws away the work since its last checkpoint. Running on until the
next checkpoint and requeueing right after it throws away nothing, but every step until then
runs slow. Requeue now only when the slow steps until the next checkpoint cost more than the
work a restart now would redo; else wait for that checkpoint (and a margin to write it), then
requeue. The restart itself (the queue, loading the checkpoint) costs the same either way.

The figures come with the alert (its annotations, from the job's progress reports): when the
job's last complete checkpoint was written (`checkpoint_at`), how far apart its checkpoints
come (`checkpoint_every`), and how much slower it runs (`slowdown`, the step time over its
usual). Without a checkpoint's time or interval nothing is weighed (the requeue goes ahead, as
before); without a slowdown the least one the rules alert on is taken, which favours waiting.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from webhook.core.evidence import Evidence
from webhook.core.signals import STRAGGLER

# The least slowdown the rules alert on (TrainingStraggler: 1.5 times the job's median step):
# taken when an alert does not say how much slower (GpuThrottled).
LEAST_SLOWDOWN = 1.5


@dataclass(frozen=True)
class Weighing:
    """What a requeue of a slow job costs now against after its next checkpoint."""

    since_checkpoint: timedelta  # the work a requeue now redoes
    slow_until_checkpoint: timedelta  # the time the slow steps until the next checkpoint lose
    requeue_at: datetime  # the next checkpoint, written: when a requeue loses nothing
    slowdown: float

    @property
    def wait(self) -> bool:
        return self.slow_until_checkpoint < self.since_checkpoint


def _latest(evidence: Iterable[Evidence]) -> Evidence | None:
    """The slowdown evidence with a checkpoint's figures that knows the latest checkpoint."""
    slow = [
        e
        for e in evidence
        if e.signal in STRAGGLER
        and e.actionable
        and e.checkpoint_at is not None
        and e.checkpoint_every is not None
    ]
    return max(slow, key=lambda e: (e.checkpoint_at, e.starts_at)) if slow else None


def _factor(e: Evidence) -> float:
    return max(e.slowdown or LEAST_SLOWDOWN, 1.0)


def requeue_at(evidence: Iterable[Evidence], margin: timedelta) -> datetime | None:
    """When the next checkpoint is written (None: the evidence gives no checkpoint's figures):
    its interval's work at the usual pace until the slowdown began (the alert's start less its
    rule's `for:`, `slow_for`; without it, at the checkpoint, the latest it can come), the rest
    at the slow pace, and `margin` to write it. Too early would throw away the work since the
    checkpoint after all, and the wait with it; too late costs only slow steps."""
    e = _latest(evidence)
    return None if e is None else _written(e, margin)


def _written(e: Evidence, margin: timedelta) -> datetime | None:
    if e.checkpoint_at is None or e.checkpoint_every is None:
        return None
    due = e.checkpoint_at + e.checkpoint_every
    onset = e.starts_at - e.slow_for if e.slow_for is not None else e.checkpoint_at
    began = max(min(onset, due), e.checkpoint_at)
    return began + (due - began) * _factor(e) + margin


def weigh(evidence: Iterable[Evidence], now: datetime, margin: timedelta) -> Weighing | None:
    """A requeue now against one once the next checkpoint is written; None when the evidence
    gives no checkpoint's figures, or that checkpoint is overdue (nothing to wait for)."""
    e = _latest(evidence)
    written = None if e is None else _written(e, margin)
    if e is None or e.checkpoint_at is None or written is None or written <= now:
        return None
    k = _factor(e)
    return Weighing(now - e.checkpoint_at, (written - now) * (1 - 1 / k), written, k)
