"""The guards' memory of past actions, indexed: by job (retry budgets, recoveries), by the
time of each drain (the breaker's sliding window) and by node (readmit).

`GuardState.history` stays a plain list that anyone may append to or replace (the loop restores
it from the ledger, the verifier appends recoveries, the engine prunes it to its retention); the
index follows it lazily: appends are taken in as they come, a replaced list is indexed afresh.
So a decision costs what its own job's history costs, not what the whole cluster's does.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Generic, Protocol, TypeVar


class Action(Protocol):
    @property
    def at(self) -> datetime: ...
    @property
    def action(self) -> str: ...
    @property
    def job(self) -> int | None: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...
    @property
    def undone(self) -> bool: ...


A = TypeVar("A", bound=Action)


def _at(a: Action) -> datetime:
    return a.at


class HistoryIndex(Generic[A]):
    def __init__(self) -> None:
        self._reset(None)

    def _reset(self, history: Sequence[A] | None) -> None:
        self._of = history
        self._taken = 0
        self._by_job: dict[int, list[A]] = {}
        self._drains: list[A] = []  # by time
        self._drains_by_node: dict[str, list[A]] = {}
        self._escalations: list[A] = []  # by time: the storms people were told of
        # The breaker's window: drains from _since on (from _drains[_lo]), counted per node.
        self._since: datetime | None = None
        self._lo = 0
        self._window: Counter[str] = Counter()

    def of_job(self, history: Sequence[A], job: int) -> list[A]:
        self._follow(history)
        return self._by_job.get(job, [])

    def escalations(self, history: Sequence[A], since: datetime | None) -> list[A]:
        """The escalations since `since` (None: all; carried out or counted so), oldest first."""
        self._follow(history)
        if since is None:
            return list(self._escalations)
        return self._escalations[bisect_left(self._escalations, since, key=_at) :]

    def drains_of(self, history: Sequence[A], node: str) -> list[A]:
        """The drains that named the node: the caller must not change the list."""
        self._follow(history)
        return self._drains_by_node.get(node, [])

    def drained(self, history: Sequence[A], since: datetime) -> Counter[str]:
        """The nodes drained since `since` (how many drains each): the caller must not change it."""
        self._follow(history)
        if self._since is None or since < self._since:
            self._lo = bisect_left(self._drains, since, key=_at)
            self._window = Counter(n for a in self._drains[self._lo :] for n in a.nodes)
        else:  # the window slides forward: only the drains it leaves behind are looked at
            while self._lo < len(self._drains) and self._drains[self._lo].at < since:
                for n in self._drains[self._lo].nodes:
                    self._window[n] -= 1
                    if not self._window[n]:
                        del self._window[n]
                self._lo += 1
        self._since = since
        return self._window

    def _follow(self, history: Sequence[A]) -> None:
        if history is not self._of or len(history) < self._taken:
            self._reset(history)  # a new list: indexed afresh
        for a in history[self._taken :]:
            self._take(a)
        self._taken = len(history)

    def _take(self, a: A) -> None:
        # An action never carried out is nobody's history but its drain's, for readmit.
        if a.job is not None and not a.undone:
            self._by_job.setdefault(a.job, []).append(a)
        if a.action == "escalate" and not a.undone:
            insort(self._escalations, a, key=_at)
        if a.action != "drain":
            return
        for n in a.nodes:
            self._drains_by_node.setdefault(n, []).append(a)
        if a.undone:
            return  # never ran: not in the breaker's window
        if self._drains and a.at < self._drains[-1].at:
            insort(self._drains, a, key=_at)
            self._since = None  # out of order: the window is counted afresh when next asked
        else:
            self._drains.append(a)
            if self._since is not None:
                if a.at >= self._since:
                    self._window.update(a.nodes)
                else:
                    self._since = None
