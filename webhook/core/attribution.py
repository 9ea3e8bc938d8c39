"""Attribution: which nodes (or what shared cause, or the application) failed a job attempt.

DESIGN.md's rules, strongest first: hardware evidence on a node (1); the node that stayed
silent while the others logged NCCL timeouts (2); a persistent straggler (3); application
errors with no hardware evidence (4); many nodes at once or most of a switch, which overrides
1-3 for the nodes it covers (5); timeouts everywhere or a stalled job with nothing to blame (6);
anything else (7).

Application evidence from a node whose ranks had already witnessed a communication failure (an
NCCL timeout or error) or stalled is that failure's echo, not the application's fault: a rank
that times out raises, prints a traceback and exits non-zero. An error that came first (the
crash the node's other ranks then time out on) is the application's, and so is one that names
no node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from webhook.core.cluster import ClusterView
from webhook.core.evidence import APPLICATION, HARDWARE, Evidence
from webhook.core.policy import SharedCause

HARDWARE_ORDER = ("gpu_hw", "node_down", "network")
# Evidence that can only say "the job stalled": it names no node by itself.
STALL = frozenset({"hang", "nccl_timeout"})


@dataclass(frozen=True)
class Attribution:
    cause: str
    nodes: tuple[str, ...]  # implicated: to drain, and to exclude from the successor
    reason: str
    # Set when a shared cause covers some of the incident's nodes while hardware evidence
    # implicates others: those are still drained, and the incident goes to a human.
    shared: str = ""


def names(nodes: Iterable[str]) -> str:
    items = sorted(set(nodes))
    return (
        ", ".join(items) if len(items) <= 6 else f"{', '.join(items[:5])} and {len(items) - 5} more"
    )


def shared_nodes(
    view: ClusterView, evidence: Iterable[Evidence], rules: SharedCause, now: datetime
) -> tuple[set[str], str]:
    """Nodes whose failure has a shared cause (rule 5), and a sentence saying which."""
    failing = {
        e.node
        for e in evidence
        if e.node and e.signal in HARDWARE and e.actionable and e.starts_at >= now - rules.window
    }
    shared: set[str] = set()
    why = []
    for switch, members in sorted(view.switches.items()):
        down = failing & set(members)
        if (
            len(down) >= rules.switch_min_nodes
            and len(down) / len(members) >= rules.switch_fraction
        ):
            shared |= down
            why.append(f"{len(down)} of the {len(members)} nodes under switch {switch}")
    jobs = {j.id for n in failing for j in view.jobs_on(n)}
    if (
        len(failing) >= rules.cluster_min_nodes
        and len(failing) >= rules.cluster_fraction * max(1, len(view.nodes))
        and len(jobs) >= 2
    ):
        shared |= failing
        why.append(f"{len(failing)} nodes across {len(jobs)} jobs")
    window = int(rules.window.total_seconds())
    return shared, f"{' and '.join(why)} failed within {window}s" if why else ""


def attribute(
    evidence: list[Evidence],
    job_nodes: tuple[str, ...],
    view: ClusterView,
    all_evidence: list[Evidence],
    rules: SharedCause,
    now: datetime,
) -> Attribution:
    """Attribute one incident from its own evidence (and everyone's, for shared causes)."""
    ev = [e for e in evidence if e.actionable]
    by_signal: dict[str, list[Evidence]] = {}
    for e in ev:
        by_signal.setdefault(e.signal, []).append(e)

    hardware = [e for s in HARDWARE_ORDER for e in by_signal.get(s, []) if e.node]
    shared, shared_why = shared_nodes(view, all_evidence, rules, now) if hardware else (set(), "")
    shared_reason = f"{shared_why}: a shared cause, not bad nodes"
    covered = {e.node for e in hardware} & shared
    # Rule 5 overrides rule 1 for the nodes it covers, and only for those.
    hardware = [e for e in hardware if e.node not in shared]
    if covered and not hardware:
        return Attribution("shared_infrastructure", (), f"{shared_reason}; nothing is drained")

    # 1. Hardware evidence implicates its nodes; the strongest kind names the cause.
    if hardware:
        cause = HARDWARE[hardware[0].signal]
        nodes = tuple(sorted({e.node for e in hardware if e.node}))
        first = hardware[0]
        reason = first.summary or f"{first.alertname} on {first.node}"
        others = [n for n in nodes if n != first.node]
        if others:
            reason += f"; hardware evidence on {names(others)} too"
        return Attribution(cause, nodes, reason, shared=shared_reason if covered else "")

    # 2. The silent node: every other node of the job logged an NCCL timeout.
    timeouts = {e.node for e in by_signal.get("nccl_timeout", []) if e.node}
    spoke = timeouts | {e.node for s in APPLICATION for e in by_signal.get(s, []) if e.node}
    # A rank stuck in its own collective (its watchdog or heartbeat says so) is silent too.
    silent = tuple(sorted(set(job_nodes) - spoke))
    # Exactly one: several silent nodes at once point at no single node (a switch, power).
    if timeouts and len(silent) == 1 and set(job_nodes) - set(silent) == timeouts:
        return Attribution(
            "node_failure",
            silent,
            f"{names(silent)} stayed silent while {names(timeouts)} logged NCCL timeouts: "
            "the collective waited for it",
        )

    # 3. A persistent straggler.
    stragglers = tuple(sorted({e.node for e in by_signal.get("straggler", []) if e.node}))
    if stragglers and len(stragglers) < max(2, len(job_nodes)):
        return Attribution(
            "straggler",
            stragglers,
            f"{names(stragglers)} is persistently slower than its peers: "
            "every collective waits for it",
        )

    # 4. Application errors with no hardware evidence (and not the echo of a timeout).
    stalled: dict[str, datetime] = {}
    for e in (e for s in STALL for e in by_signal.get(s, [])):
        if e.node:
            stalled[e.node] = min(e.starts_at, stalled.get(e.node, e.starts_at))
    app = [
        e
        for s in ("gpu_app", "app_error")
        for e in by_signal.get(s, [])
        if e.node is None or e.node not in stalled or e.starts_at < stalled[e.node]
    ]
    if app:
        where = {e.node for e in app if e.node}
        scope = f"on {names(where)}" if where else "in the job"
        example = next((e.summary for e in app if e.summary), app[0].alertname)
        return Attribution(
            "application",
            (),
            f"Application errors {scope} and no hardware evidence: {example}",
        )

    # 6. Timeouts on every rank, or stalled progress, with nothing to blame.
    if by_signal.get("hang") or (timeouts and timeouts >= set(job_nodes)):
        what = (
            "NCCL timeouts on every node"
            if timeouts >= set(job_nodes) and timeouts
            else "stalled progress"
        )
        return Attribution("hang", (), f"The job hangs ({what}) and no node is to blame")

    signals = ", ".join(sorted(by_signal)) or "none"
    return Attribution(
        "unknown", (), f"The evidence ({signals}) points at no node and no application"
    )


def stall_only(attr: Attribution, evidence: list[Evidence]) -> bool:
    """Whether all an incident can say is "stalled": no node named, and only hang signals and
    NCCL timeouts. Such an incident waits for the evidence that can name a node."""
    signals = {e.signal for e in evidence if e.actionable}
    return (
        attr.cause in ("hang", "unknown") and not attr.nodes and bool(signals) and signals <= STALL
    )
