"""Rule 5's input, kept as evidence arrives: which nodes have hardware evidence that started
within the shared-cause window, counted per switch.

Asked of the whole evidence at every decision, "does a shared cause cover this node?" costs what
the cluster has ever said, so a storm got slower with every alert. Here a node enters the window
when its hardware evidence arrives and leaves it once, when the window has moved past its latest
start; a decision costs what its own nodes do.

A node counts while its latest hardware evidence started at or after `now - window` (later
starts count too: an alert may say it started after the instant a decision is made for).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Protocol, TypeVar

from webhook.core.cluster import ClusterView
from webhook.core.evidence import Evidence
from webhook.core.policy import FAILURE_RATE, SharedCause
from webhook.core.signals import HARDWARE

T = TypeVar("T")


class FailingNodes:
    """The nodes with hardware evidence, by the latest start of it, and the window's count of
    them per switch, as of the last `at`."""

    def __init__(self) -> None:
        self.latest: dict[str, datetime] = {}
        self._cutoff: datetime | None = None
        self._window: set[str] = set()  # nodes whose latest start is >= the cutoff
        # (latest start, node) of the nodes in the window; entries a later start replaced stay
        # behind and are skipped when they come up.
        self._heap: list[tuple[datetime, str]] = []
        # The topology the counts were made against (a new view brings a new one).
        self._switches: dict[str, tuple[str, ...]] | None = None
        self._switches_of: dict[str, list[str]] = {}
        self._size: dict[str, int] = {}
        self._count: Counter[str] = Counter()
        self._rules: SharedCause | None = None
        self._qualifying: set[str] = set()  # switches most of whose nodes failed
        # Counts every change of the window or the topology: what a verdict computed over the
        # whole window (a burst, its storm's nodes) holds until the next change (`_held`).
        self.version = 0
        self._held: dict[object, object] = {}

    def add(self, ev: Evidence) -> None:
        if not (ev.node and ev.signal in HARDWARE and ev.actionable):
            return
        last = self.latest.get(ev.node)
        if last is not None and last >= ev.starts_at:
            return
        self.latest[ev.node] = ev.starts_at
        if self._cutoff is None or ev.starts_at >= self._cutoff:
            heapq.heappush(self._heap, (ev.starts_at, ev.node))
            self._enter(ev.node)

    def at(
        self,
        now: datetime,
        view: ClusterView,
        rules: SharedCause,
        failure_rate: float = FAILURE_RATE,
    ) -> SharedCauses:
        """Rule 5's verdict at `now`; it holds until evidence is added again."""
        if view.switches is not self._switches:
            # A new view (every refresh) mostly brings the same topology: count afresh only
            # when it changed.
            if view.switches != self._switches:
                self._topology(view.switches)
            self._switches = view.switches
        if rules is not self._rules:
            self._rules = rules
            self._qualifying = {s for s in self._count if self._qualifies(s)}
            self._changed()
        cutoff = now - rules.window
        if self._cutoff is None or cutoff < self._cutoff:
            self._refill(cutoff)  # the first look, or the clock went back: count afresh
        else:
            self._cutoff = cutoff
            while self._heap and self._heap[0][0] < cutoff:
                start, node = heapq.heappop(self._heap)
                if self.latest.get(node) == start:
                    self._leave(node)
        return SharedCauses(self, view, rules, failure_rate)

    def forget(self, before: datetime) -> None:
        """Retention: nodes whose hardware evidence all started before `before` are forgotten
        (`before` is older than any window: they would leave it at the next look)."""
        for node, start in list(self.latest.items()):
            if start < before:
                if node in self._window:
                    self._leave(node)
                del self.latest[node]

    # ---- the counts ---------------------------------------------------------------------
    def _topology(self, switches: dict[str, tuple[str, ...]]) -> None:
        self._switches = switches
        self._switches_of = {}
        for switch, members in switches.items():
            for node in set(members):
                self._switches_of.setdefault(node, []).append(switch)
        self._size = {s: len(members) for s, members in switches.items()}
        self._recount()

    def _refill(self, cutoff: datetime) -> None:
        self._cutoff = cutoff
        self._window = {n for n, start in self.latest.items() if start >= cutoff}
        self._heap = [(self.latest[n], n) for n in self._window]
        heapq.heapify(self._heap)
        self._recount()

    def _changed(self) -> None:
        self.version += 1
        self._held.clear()

    def held(self, key: object, make: Callable[[], T]) -> T:
        """What `make` computes over the window, kept until the window changes."""
        if key not in self._held:
            self._held[key] = make()
        return self._held[key]  # type: ignore[return-value]

    def _recount(self) -> None:
        self._changed()
        self._count = Counter(s for n in self._window for s in self._switches_of.get(n, ()))
        self._qualifying = {s for s in self._count if self._qualifies(s)}

    def _qualifies(self, switch: str) -> bool:
        rules, down = self._rules, self._count[switch]
        return (
            rules is not None
            and down >= rules.switch_min_nodes
            and down / self._size[switch] >= rules.switch_fraction
        )

    def _enter(self, node: str) -> None:
        if node in self._window:
            return
        self._changed()
        self._window.add(node)
        for s in self._switches_of.get(node, ()):
            self._count[s] += 1
            if self._qualifies(s):
                self._qualifying.add(s)

    def _leave(self, node: str) -> None:
        self._changed()
        self._window.discard(node)
        for s in self._switches_of.get(node, ()):
            self._count[s] -= 1
            if not self._count[s]:
                del self._count[s]
            if not self._qualifies(s):
                self._qualifying.discard(s)


class SharedCauses:
    """Rule 5 at one instant: whether a shared cause covers a node, and a sentence saying which
    (many nodes across jobs at once, or most of a switch)."""

    def __init__(
        self,
        failing: FailingNodes,
        view: ClusterView,
        rules: SharedCause,
        failure_rate: float = FAILURE_RATE,
    ) -> None:
        self._failing, self._view, self._rules = failing, view, rules
        self._rate = failure_rate
        self._jobs: int | None = None
        self._reason: str | None = None
        self._burst: bool | None = None
        self._storms: dict[tuple[str, ...], tuple[tuple[str, ...], frozenset[str]]] = {}

    def _many(self, down: int) -> bool:
        """Enough nodes for a cluster-wide cause (with failures across two jobs or more)."""
        rules = self._rules
        return down >= max(
            rules.cluster_min_nodes, rules.cluster_fraction * max(1, len(self._view.nodes))
        )

    @property
    def cluster_wide(self) -> bool:
        return self._many(len(self._failing._window)) and self.jobs >= 2

    @property
    def burst(self) -> bool:
        """Rule 5 against the cluster's own failure rate: more nodes failed within the window,
        across leaf switches, than independent failures would produce once in
        `1 / burst_chance` windows. A controller's or a fabric's
        blip, a bad rollout: one cause, however small a share of the cluster it is."""
        if self._burst is None:
            key = ("burst", id(self._rules), self._rate, len(self._view.nodes))
            self._burst = self._failing.held(key, self._is_burst)
        return self._burst

    def _units(self) -> set[str]:
        """The failures in the window as independent faults would be counted: each failing
        switch (rule 5's) as one, each other node as one."""
        return self._failing.held("units", self._count_units)

    def _count_units(self) -> set[str]:
        failing = self._failing
        units: set[str] = set()
        for n in failing._window:
            qualifying = [s for s in failing._switches_of.get(n, ()) if s in failing._qualifying]
            units |= {f"switch {s}" for s in qualifying} if qualifying else {n}
        return units

    def burst_count(self) -> int:
        """The fewest failures in a window that make a burst (at least `burst_min_nodes`)."""
        rules, expected = self._rules, self.expected_failures()
        count = rules.burst_min_nodes
        while burst_chance(count, expected) >= rules.burst_chance:
            count += 1
        return count

    def _is_burst(self) -> bool:
        failing = self._failing
        needed = self.burst_count()
        if len(failing._window) < needed:
            return False
        # Counted until enough (a storm's window holds thousands of nodes): each failing
        # switch (rule 5's) as one failure, each other node as one, and their leaf switches.
        units: set[str] = set()
        leaves: set[str] = set()
        for n in failing._window:
            under = failing._switches_of.get(n, ())
            leaves.update(under)
            qualifying = [s for s in under if s in failing._qualifying]
            if qualifying:
                units.update(f"switch {s}" for s in qualifying)
            else:
                units.add(n)
            if len(units) >= needed and (not self._view.switches or len(leaves) >= 2):
                # One switch's nodes are the switch rule's to judge. Whatever jobs hold them:
                # a job of 1,920 nodes on a 2,048-node cluster holds nearly every node a blip
                # touches, and a job that took its own nodes down would not make them bad.
                return True
        return False

    def expected_failures(self) -> float:
        """How many node failures the window holds on average, at the cluster's failure rate."""
        rules = self._rules
        days = rules.window.total_seconds() / 86400
        return len(self._view.nodes) * self._rate / 1000 * days

    @property
    def jobs(self) -> int:
        """The jobs that held the failing nodes when they failed (counted once per verdict, only
        when asked). A job Slurm has since ended (NODE_FAIL) still counts: counting only the
        jobs still running, a storm vanished once Slurm noticed it, and its nodes were drained."""
        if self._jobs is None:
            failing = self._failing
            self._jobs = len(
                {j.id for n in failing._window for j in self._view.jobs_on(n, failing.latest[n])}
            )
        return self._jobs

    def covers(self, node: str) -> bool:
        failing = self._failing
        if node not in failing._window:
            return False
        return (
            any(s in failing._qualifying for s in failing._switches_of.get(node, ()))
            or self.cluster_wide
            or self.burst
        )

    def storm(self, node: str) -> tuple[str, ...]:
        """Every failing node of the storms that cover `node`: its failing switches' nodes, or
        the whole window's for a cluster-wide cause or a burst (sorted)."""
        return self._storm(node)[0]

    def storm_set(self, node: str) -> frozenset[str]:
        """`storm(node)` as a set (made once a storm)."""
        return self._storm(node)[1]

    def _storm(self, node: str) -> tuple[tuple[str, ...], frozenset[str]]:
        if not self.covers(node):
            return (), frozenset()
        failing = self._failing
        # Once a verdict for each storm: an incident of a storm asks for every node it covers.
        if self.cluster_wide or self.burst:
            key: tuple[str, ...] = ()
        else:
            key = tuple(
                sorted(s for s in failing._switches_of.get(node, ()) if s in failing._qualifying)
            )
        if key not in self._storms:
            switches = set(key)

            def members() -> tuple[tuple[str, ...], frozenset[str]]:
                nodes = frozenset(
                    n
                    for n in failing._window
                    if not key or switches & set(failing._switches_of.get(n, ()))
                )
                return tuple(sorted(nodes)), nodes

            self._storms[key] = failing.held(("storm", key), members)
        return self._storms[key]

    def away(self, node: str) -> tuple[str, ...]:
        """Where a job that failed of the shared cause on `node` is to keep off: every node of
        the failing switches `node` is under, those that have not alerted yet too (a switch
        that failed most of its nodes may fail the rest). Nothing for a cluster-wide cause:
        there is no healthy side to move to (power, the fabric's core, storage)."""
        if not self.covers(node) or self.cluster_wide or self.burst:
            return ()
        failing = self._failing
        switches = [s for s in failing._switches_of.get(node, ()) if s in failing._qualifying]
        return tuple(sorted({n for s in switches for n in self._view.switches.get(s, ())}))

    def grew_wide(self, at: datetime) -> bool:
        """Whether, within a window after `at`, the failures of some window's span were many
        nodes across jobs (a cluster-wide cause): for a verdict kept from `at`, when the storm
        covered one switch, and checked after rule 5's window moved past it. Counted from the
        latest failure of each node, over the spans that end at or after `at` (one pass, the
        jobs counted as the span slides)."""
        failing, rules = self._failing, self._rules
        span = rules.window
        near = sorted(
            (start, n) for n, start in failing.latest.items() if at - span <= start <= at + span
        )
        held = [{j.id for j in self._view.jobs_on(n, start)} for start, n in near]
        jobs: Counter[int] = Counter()
        first = 0
        for last, (end, _) in enumerate(near):
            jobs.update(held[last])
            while near[first][0] < end - span:
                jobs.subtract(held[first])
                jobs -= Counter()  # drop the jobs no node in the span holds any more
                first += 1
            if end >= at and self._many(last - first + 1) and len(jobs) >= 2:
                return True
        return False

    @property
    def reason(self) -> str:
        if self._reason is None:
            failing = self._failing
            why = [
                f"{failing._count[s]} of the {failing._size[s]} nodes under switch {s}"
                for s in sorted(failing._qualifying)
            ]
            if self.cluster_wide:
                why.append(f"{len(failing._window)} nodes across {self.jobs} jobs")
            burst = not self.cluster_wide and self.burst
            if burst:
                leaves = {s for n in failing._window for s in failing._switches_of.get(n, ())}
                on = f" on {len(leaves)} leaf switches" if leaves else ""
                down, units = len(failing._window), len(self._units())
                many = f"{down} nodes" if down == units else f"{down} nodes in {units} failures"
                why.append(f"{many}{on}")
            window = int(self._rules.window.total_seconds())
            self._reason = f"{' and '.join(why)} failed within {window}s" if why else ""
            if burst:
                self._reason += (
                    f", where this cluster's failure rate ({self._rate:.3g} per "
                    f"1,000 node-days) expects {self.expected_failures():.1g}"
                )
        return self._reason


class RuleFive(Protocol):
    """What attribution asks of rule 5."""

    def covers(self, node: str) -> bool: ...

    def away(self, node: str) -> tuple[str, ...]: ...

    def storm(self, node: str) -> tuple[str, ...]: ...

    def storm_set(self, node: str) -> frozenset[str]: ...

    @property
    def reason(self) -> str: ...


# Per node of an incident: the start of its latest hardware evidence that rule 5 covered, rule
# 5's words then, and where a job was to keep off (SharedCauses.away).
Judgement = dict[str, tuple[datetime, str, tuple[str, ...]]]


class Judged:
    """Rule 5 for one incident: the verdict now, and what it said of this incident's evidence
    before. Evidence once judged part of a shared cause stays so for its incident: a revision
    after the window has moved past the storm must not blame the nodes it spared (the goodput
    simulator found a leaf switch's escalation revised, when the job's NCCL timeouts came ten
    minutes later, into draining the whole leaf). A node's newer hardware evidence is judged
    afresh."""

    def __init__(
        self,
        live: SharedCauses,
        before: Judgement,
        evidence: Iterable[Evidence],
        *,
        check_growth: bool = False,
    ):
        # check_growth: whether a kept switch verdict is checked for a storm that grew
        # cluster-wide since (only shared_cause.requeue_away reads `away`).
        self._live, self._before, self._check_growth = live, before, check_growth
        self._grew: bool | None = None
        self._latest: dict[str, datetime] = {}
        for e in evidence:
            if e.node and e.signal in HARDWARE and e.actionable:
                self._latest[e.node] = max(e.starts_at, self._latest.get(e.node, e.starts_at))
        self.now: Judgement = {}  # what this verdict covered, to keep for the next one

    def covers(self, node: str) -> bool:
        latest = self._latest.get(node)
        if self._live.covers(node):
            if latest is not None:
                self.now[node] = (latest, self._live.reason, self._live.away(node))
            return True
        seen = self._before.get(node)
        if seen is None or (latest is not None and latest > seen[0]):
            return False
        self.now[node] = seen
        return True

    def away(self, node: str) -> tuple[str, ...]:
        """As the verdict that covered `node` said (the live one, or the one kept)."""
        if self._live.covers(node):
            return self._live.away(node)
        seen = self.now.get(node) or self._before.get(node)
        if seen is None or not seen[2]:
            return ()
        if self._check_growth:
            if self._grew is None:
                # Once per decision, from the incident's earliest kept start: the spans after
                # it hold those after any later one.
                kept = [v[0] for v in (*self._before.values(), *self.now.values()) if v[2]]
                self._grew = self._live.grew_wide(min(kept, default=seen[0]))
            if self._grew:
                return ()  # the storm grew past its switch after the incident was decided
        return seen[2]

    def storm(self, node: str) -> tuple[str, ...]:
        """The live verdict's storm (a kept verdict's nodes are this incident's own)."""
        return self._live.storm(node)

    def storm_set(self, node: str) -> frozenset[str]:
        return self._live.storm_set(node)

    @property
    def reason(self) -> str:
        said = self._live.reason
        if said:
            return said
        return "; ".join(sorted({why for _, why, _ in self._before.values()}))


def burst_chance(count: int, expected: float) -> float:
    """The chance that independent failures, `expected` on average in a window (Poisson), number
    `count` or more in one: the tail summed from `count` up (1 - the head loses every digit for
    the small chances a burst is judged by)."""
    if expected <= 0:
        return 0.0 if count > 0 else 1.0
    term = math.exp(-expected + count * math.log(expected) - math.lgamma(count + 1))
    total, i = 0.0, count
    while term > total * 1e-12 and i < count + 1000:
        total += term
        i += 1
        term *= expected / i
    return min(1.0, total)
