"""What people see of the nodes slurmedic took out of service and of their repairs: each node's
failures beside its latest repair, the nodes waiting for a person to replace them first, then
the lemons; and what /metrics makes of the repairs (pure).

`slurmedic nodes`, `slurmedic repairs`, the console's nodes page and /metrics all read through
here, so that a node waiting for replacement is the same node in each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from webhook.core.cluster import IN_SERVICE
from webhook.core.failures import NodeRecord
from webhook.core.lifecycle import EXECUTED
from webhook.core.repairs import REPLACE, Repair, Step


@dataclass(frozen=True)
class Listed:
    """A repair as people read it: where it stands and why it stands there."""

    repair: Repair
    reason: str


@dataclass(frozen=True)
class NodeView:
    """One node: its failures over the period (None: none, only a repair begun in it), its
    repairs begun in the period (newest first) and its state in the loop's cluster view (None:
    the view does not know it)."""

    node: str
    record: NodeRecord | None
    repairs: tuple[Listed, ...] = ()
    status: str | None = None

    @property
    def latest(self) -> Listed | None:
        return self.repairs[0] if self.repairs else None

    @property
    def awaiting_replacement(self) -> bool:
        latest = self.latest
        return latest is not None and awaiting_replacement(latest.repair.state, self.status)


def in_service(status: str) -> bool:
    """A node's long state (sinfo's `idle`, `mixed`, `drained`, `down*`) can take a job."""
    return status in IN_SERVICE


def awaiting_replacement(state: str, status: str | None) -> bool:
    """A node's latest repair (in `state`) sent it to a person for replacement and the cluster
    view (`status`) does not show it back in service. A node the view does not know counts:
    nothing says it is back."""
    return state == REPLACE and not (status is not None and in_service(status))


def node_views(
    records: Sequence[NodeRecord],
    repairs: Iterable[tuple[Repair, str]],
    statuses: Mapping[str, str],
) -> list[NodeView]:
    """Each node that failed or was repaired in the period, the nodes waiting for replacement
    first (they need a person now), then in `records`' order (the lemons first), then the nodes
    only repaired. `repairs`: newest first, as the ledger lists them."""
    by_node: dict[str, list[Listed]] = {}
    for repair, reason in repairs:
        by_node.setdefault(repair.node, []).append(Listed(repair, reason))
    known = {r.node for r in records}
    views = [
        NodeView(r.node, r, tuple(by_node.get(r.node, ())), statuses.get(r.node)) for r in records
    ]
    views += [
        NodeView(node, None, tuple(listed), statuses.get(node))
        for node, listed in sorted(by_node.items())
        if node not in known
    ]
    # A stable sort: within each group the order above holds.
    return sorted(views, key=lambda v: not v.awaiting_replacement)


def returned_at(repair: Repair) -> datetime | None:
    """When the repaired node was back in service: its resume ran (None: not, or not yet)."""
    step = repair.last("resume")
    if step is None or step.state != EXECUTED:
        return None
    return step.done_at or step.at


def step_text(step: Step) -> str:
    """One step as a line says it: `health_check #41 executed (failed: exit 1: ...)`."""
    said = {True: "passed", False: "failed", None: ""}[step.passed]
    said = ": ".join(p for p in (said, step.detail) if p)
    text = f"{step.action} #{step.id} {step.state}"
    return f"{text} ({said})" if said else text
