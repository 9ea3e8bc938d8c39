"""Attribution: which nodes (or what shared cause, or the application) failed a job attempt.

The rules of docs/operations.md, strongest first: hardware evidence on a node (1); the node
that stayed silent while the others logged NCCL timeouts (2); a persistent straggler (3);
application errors with no hardware evidence (4); many nodes at once or most of a switch,
which overrides 1-3 for the nodes it covers (5); timeouts everywhere or a stalled job with
nothing to blame (6); anything else (7). RULES holds them in the order they are tried: the
first that speaks decides.

Application evidence from a node whose ranks had already witnessed a communication failure (an
NCCL timeout or error) or stalled is that failure's echo, not the application's fault: a rank
that times out raises, prints a traceback and exits non-zero. An error that came first (the
crash the node's other ranks then time out on) is the application's, and so is one that names
no node.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from webhook.core.evidence import Evidence
from webhook.core.failures import Failure
from webhook.core.policy import SHARED
from webhook.core.shared_cause import RuleFive
from webhook.core.signals import (
    APPLICATION,
    DEGRADED,
    HANG,
    HARDWARE,
    STALL,
    STRAGGLER,
    TIMEOUT,
)

HARDWARE_ORDER = tuple(HARDWARE)


@dataclass(frozen=True)
class Attribution:
    cause: str
    nodes: tuple[str, ...]  # implicated: to drain, and to exclude from the successor
    reason: str
    # Set when a shared cause covers some of the incident's nodes while hardware evidence
    # implicates others: those are still drained, and the incident goes to a human.
    shared: str = ""
    # Where a shared cause covers some of its nodes: the nodes of the failing switches, which a
    # job requeued away from it keeps off (policy shared_cause.requeue_away). Empty when a cause
    # is cluster-wide: there is no healthy side to move to.
    avoid: tuple[str, ...] = ()
    # The latest start of the hardware evidence a shared cause covers: when the storm was.
    storm_at: datetime | None = None
    # Application: it failed on some of the job's nodes and the others timed out after it (one
    # rank's crash), not on every node alike (the code); `crashed`: where the errors were.
    partial: bool = False
    crashed: tuple[str, ...] = ()
    # Every node of the storm a shared cause covers (not only this incident's): one escalation
    # tells a person of the whole storm.
    storm: tuple[str, ...] = ()


def names(nodes: Iterable[str]) -> str:
    """A list of nodes for a reason: all of them up to six, else the first five and a count
    (a storm names thousands: only the five are sorted out)."""
    unique = set(nodes)
    if len(unique) <= 6:
        return ", ".join(sorted(unique))
    return f"{', '.join(heapq.nsmallest(5, unique))} and {len(unique) - 5} more"


@dataclass(frozen=True)
class Facts:
    """What the rules read of one incident: its actionable evidence by signal, its job's nodes,
    and what rule 5 says of its hardware evidence."""

    job_nodes: frozenset[str]
    by_signal: dict[str, list[Evidence]]
    # Hardware evidence on nodes no shared cause covers, the strongest kind first.
    hardware: list[Evidence]
    covered: frozenset[str]  # nodes with hardware evidence that a shared cause covers
    shared: str  # why those are a shared cause ("" when none is covered)
    # The failing switches' nodes, when every covered node is under one (SharedCauses.away).
    avoid: tuple[str, ...] = ()
    storm_at: datetime | None = None  # the latest start of the covered evidence
    storm: tuple[str, ...] = ()  # every failing node of the storms that cover those
    # Nodes with degraded evidence (still working, to leave service when convenient), and
    # those whose GPU showed an application-class XID under other jobs too (`suspects`).
    degraded: tuple[str, ...] = ()
    suspects: tuple[tuple[Evidence, tuple[Failure, ...]], ...] = ()

    def of(self, *signals: str) -> list[Evidence]:
        return [e for s in signals for e in self.by_signal.get(s, [])]

    def nodes_of(self, *signals: str) -> set[str]:
        return {e.node for e in self.of(*signals) if e.node}


def facts(
    evidence: Iterable[Evidence],
    job_nodes: Iterable[str],
    shared: RuleFive,
    suspects: Mapping[str, Sequence[Failure]] | None = None,
) -> Facts:
    by_signal: dict[str, list[Evidence]] = {}
    for e in evidence:
        if e.actionable:
            by_signal.setdefault(e.signal, []).append(e)
    hardware = [e for s in HARDWARE_ORDER for e in by_signal.get(s, []) if e.node]
    covered = frozenset(e.node for e in hardware if e.node and shared.covers(e.node))
    away = [shared.away(n) for n in sorted(covered)]
    degraded = {e.node for s in DEGRADED for e in by_signal.get(s, []) if e.node}
    # An application-class XID on a GPU that showed one under other jobs within the window.
    suspected = [
        (e, tuple(suspects[e.gpu]))
        for e in sorted(
            (e for s in APPLICATION for e in by_signal.get(s, [])),
            key=lambda e: (e.starts_at, e.node or ""),
        )
        if suspects and e.node and e.gpu is not None and e.gpu in suspects
    ]
    degraded |= {e.node for e, _ in suspected if e.node}
    return Facts(
        job_nodes=frozenset(job_nodes),
        by_signal=by_signal,
        hardware=[e for e in hardware if e.node not in covered],
        covered=covered,
        shared=f"{shared.reason}: a shared cause, not bad nodes" if covered else "",
        avoid=tuple(sorted({n for a in away for n in a})) if away and all(away) else (),
        storm_at=max((e.starts_at for e in hardware if e.node in covered), default=None),
        storm=_storm(covered, shared),
        degraded=tuple(sorted(degraded - covered)),
        suspects=tuple(suspected),
    )


def _storm(covered: frozenset[str], shared: RuleFive) -> tuple[str, ...]:
    """Every node of the storms that cover these: each storm asked once (a switch's, or the
    whole window's), not once a node."""
    if not covered:
        return ()
    # The verdict hands each storm out once, sorted and as a set.
    sets = {id(s): s for s in map(shared.storm_set, covered)}
    if len(sets) == 1:
        (members,) = sets.values()
        if covered <= members:
            return shared.storm(next(iter(covered)))
    return tuple(sorted(covered.union(*sets.values())))


Rule = Callable[[Facts], Attribution | None]


def shared_cause_only(f: Facts) -> Attribution | None:
    """5. A shared cause covers every node with hardware evidence: nothing is to blame on them.
    (Where it covers only some, rule 1 blames the others.)"""
    if f.covered and not f.hardware:
        return Attribution(
            SHARED,
            (),
            f"{f.shared}; nothing is drained",
            avoid=f.avoid,
            storm_at=f.storm_at,
            storm=f.storm,
        )
    return None


def _with_degraded(nodes: Iterable[str], f: Facts) -> tuple[tuple[str, ...], str]:
    """The nodes to blame and those with degraded evidence beside them: a job requeued anyway
    keeps off a degraded node too, and it leaves service with the others."""
    named = set(nodes)
    also = sorted(set(f.degraded) - named)
    note = f"; {names(also)} degraded too" if also else ""
    return tuple(sorted(named | set(also))), note


def hardware(f: Facts) -> Attribution | None:
    """1. Hardware evidence implicates its nodes; the strongest kind names the cause."""
    if not f.hardware:
        return None
    first = f.hardware[0]
    nodes = tuple(sorted({e.node for e in f.hardware if e.node}))
    reason = first.summary or f"{first.alertname} on {first.node}"
    others = [n for n in nodes if n != first.node]
    if others:
        reason += f"; hardware evidence on {names(others)} too"
    nodes, note = _with_degraded(nodes, f)
    return Attribution(
        HARDWARE[first.signal],
        nodes,
        reason + note,
        shared=f.shared,
        avoid=f.avoid,
        storm_at=f.storm_at,
        storm=f.storm,
    )


def silent_node(f: Facts) -> Attribution | None:
    """2. The silent node: every other node of the job logged an NCCL timeout. A rank stuck in
    its own collective (its watchdog or heartbeat says so) is silent too; several silent nodes
    at once point at no single node (a switch, power)."""
    timeouts = f.nodes_of(*TIMEOUT)
    silent = tuple(sorted(f.job_nodes - timeouts - f.nodes_of(*APPLICATION)))
    if timeouts and len(silent) == 1 and f.job_nodes - set(silent) == timeouts:
        nodes, note = _with_degraded(silent, f)
        return Attribution(
            "node_failure",
            nodes,
            f"{names(silent)} stayed silent while {names(timeouts)} logged NCCL timeouts: "
            "the collective waited for it" + note,
        )
    return None


def straggler(f: Facts) -> Attribution | None:
    """3. A persistent straggler (not every node of the job: then none is slower)."""
    stragglers = tuple(sorted(f.nodes_of(*STRAGGLER)))
    if stragglers and len(stragglers) < max(2, len(f.job_nodes)):
        nodes, note = _with_degraded(stragglers, f)
        return Attribution(
            "straggler",
            nodes,
            f"{names(stragglers)} is persistently slower than its peers: "
            "every collective waits for it" + note,
        )
    return None


def degraded(f: Facts) -> Attribution | None:
    """1b. Degraded hardware (corrected errors rising, a remap pending, a contained error): the
    nodes leave service; their job is left running unless it fails, stalls or slows (the
    guards' job_running). Before the application's rule: a job that fails on a degraded node
    is requeued without it, not blamed on its code."""
    if not f.degraded:
        return None
    ev = [e for s in DEGRADED for e in f.by_signal.get(s, []) if e.node in f.degraded]
    if ev:
        first = min(ev, key=lambda e: (e.starts_at, e.node or ""))
        reason, named = first.summary or f"{first.alertname} on {first.node}", first.node
    else:
        suspect, earlier = f.suspects[0]
        jobs = sorted({str(x.job) for x in earlier if x.job is not None})
        since = min(x.at for x in earlier)
        reason = (
            f"XID {suspect.xid} on GPU {suspect.gpu} of {suspect.node}, as under job(s) "
            f"{', '.join(jobs)} since {since.astimezone(UTC):%Y-%m-%d %H:%M}Z: repeated "
            f"faults on one GPU under different jobs point at the GPU, not at the code "
            f"(NVIDIA's XID-31 workflow); it is drained for diagnostics"
        )
        named = suspect.node
    others = [n for n in f.degraded if n != named]
    if others:
        reason += f"; degraded hardware on {names(others)} too"
    return Attribution("degraded", f.degraded, reason)


def application(f: Facts) -> Attribution | None:
    """4. Application errors with no hardware evidence (and not the echo of a timeout or a
    stall that came first on the same node)."""
    stalled: dict[str, datetime] = {}
    for e in f.of(*sorted(STALL)):
        if e.node:
            stalled[e.node] = min(e.starts_at, stalled.get(e.node, e.starts_at))
    app = [
        e
        for e in f.of(*APPLICATION)
        if e.node is None or e.node not in stalled or e.starts_at < stalled[e.node]
    ]
    if not app:
        return None
    where = {e.node for e in app if e.node}
    scope = f"on {names(where)}" if where else "in the job"
    example = next((e.summary for e in app if e.summary), app[0].alertname)
    # One rank's crash: its error on one node of the job (its other ranks, if they say
    # anything, time out or lose their peer: an agent like torchrun kills them at once), or on
    # some of its nodes while the others timed out after it. Errors on several nodes and
    # nothing else, or on every node, or naming none, are the code's.
    waited = f.nodes_of(*TIMEOUT) - where
    partial = bool(where) and where < f.job_nodes and (bool(waited) or len(where) == 1)
    if partial and waited:
        scope += f" while {names(waited)} timed out waiting"
    elif partial:
        scope += f" alone of the job's {len(f.job_nodes)} nodes"
    return Attribution(
        "application",
        (),
        f"Application errors {scope} and no hardware evidence: {example}",
        partial=partial,
        crashed=tuple(sorted(where)),
    )


def hang(f: Facts) -> Attribution | None:
    """6. Timeouts on every rank, or stalled progress, with nothing to blame."""
    timeouts = f.nodes_of(*TIMEOUT)
    everywhere = bool(timeouts) and timeouts >= f.job_nodes
    if not (f.of(*HANG) or everywhere):
        return None
    what = "NCCL timeouts on every node" if everywhere else "stalled progress"
    return Attribution("hang", (), f"The job hangs ({what}) and no node is to blame")


def unknown(f: Facts) -> Attribution:
    """7. Anything else."""
    signals = ", ".join(sorted(f.by_signal)) or "none"
    return Attribution(
        "unknown", (), f"The evidence ({signals}) points at no node and no application"
    )


# The rules in the order they are tried; `unknown` speaks when none does.
RULES: tuple[tuple[str, Rule], ...] = (
    ("shared_cause", shared_cause_only),
    ("hardware", hardware),
    ("silent_node", silent_node),
    ("straggler", straggler),
    ("degraded", degraded),
    ("application", application),
    ("hang", hang),
)


def attribute(
    evidence: Iterable[Evidence],
    job_nodes: Iterable[str],
    shared: RuleFive,
    suspects: Mapping[str, Sequence[Failure]] | None = None,
) -> Attribution:
    """Attribute one incident from its own evidence, rule 5's verdict on the cluster, and the
    GPUs whose application-class XIDs came under other jobs too (`suspects`: GPU -> those
    earlier faults)."""
    f = facts(evidence, job_nodes, shared, suspects)
    for _name, rule in RULES:
        if (found := rule(f)) is not None:
            return found
    return unknown(f)


def blames_nobody(attr: Attribution) -> bool:
    """Whether the attribution says only that the job stalled: a hang or an unknown failure,
    no node named."""
    return attr.cause in ("hang", "unknown") and not attr.nodes


def stall_only(attr: Attribution, evidence: list[Evidence]) -> bool:
    """Whether all an incident can say is "stalled": no node named, and only hang signals and
    NCCL timeouts. Such an incident waits for the evidence that can name a node."""
    signals = {e.signal for e in evidence if e.actionable}
    return blames_nobody(attr) and bool(signals) and signals <= STALL
