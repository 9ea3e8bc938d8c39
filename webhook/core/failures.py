"""What failed before: failures remembered per node and per GPU, across jobs, resumes and
restarts of slurmedic (the ledger keeps them; Engine.restore reads them back).

Two kinds of memory, one record:
- a node slurmedic drained for its own fault (a cause it drains for): a node that fails again
  within `repeats.window` after it was back in service is a hardware suspect (the lemons that
  cause most exclusions in every published fleet), not one to cycle through drain and resume;
- an application-class XID (13, 31, 43) on one GPU: the same GPU under another job within the
  window points at the GPU, not at the code (NVIDIA's XID-31 workflow).

A GPU is known by its UUID where the alert carries one (dcgm-exporter's `UUID`, the rules'
`uuid`), else by its node and index, else by its node and PCI address (a job log's XID line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from webhook.core.validation import is_number

# RESTART_APP classes whose repeats on one GPU point at the GPU (the catalog's investigatory
# workflows for 13 and 31; 43 is their kin, a reset channel verification error).
WATCHED_XIDS = frozenset({13, 31, 43})
APP_XID = "xid:"  # the kind of an application-class XID remembered on a GPU: `xid:31`


@dataclass(frozen=True)
class Failure:
    at: datetime
    node: str
    kind: str  # the cause a drain was for, or `xid:<code>` for an application XID on a GPU
    incident: str = ""
    job: int | None = None
    gpu: str | None = None
    # A drain that ran took the node out of service; one recorded (monitor mode) or waiting
    # left it in service, where its fault may alert again.
    ran: bool = True

    @property
    def app_xid(self) -> bool:
        return self.kind.startswith(APP_XID)


_PCI = re.compile(r"^(?:[0-9a-fA-F]+:)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?$")


def gpu_of(labels: Mapping[str, str], node: str | None) -> str | None:
    """The GPU an alert names, as remembered: `GPU-<uuid>`, else `<node>/<index>`, else
    `<node>/pci:<bus>:<device>` (the kernel's `0000:3b:00` and dcgm-exporter's
    `00000000:3B:00.0` alike). None: it names none."""
    uuid = labels.get("uuid") or labels.get("UUID")
    if uuid:
        return uuid[:96]
    if node is None:
        return None
    index = labels.get("gpu", "")
    if is_number(index):
        return f"{node}/{int(index)}"
    found = _PCI.match(labels.get("pci_bus_id", ""))
    if found:
        return f"{node}/pci:{found.group(1).lower()}:{found.group(2).lower()}"
    return None


class FailureMemory:
    """The failures of the last window, by node and by GPU, in the order they came."""

    def __init__(self, failures: Iterable[Failure] = ()) -> None:
        self._by_node: dict[str, list[Failure]] = {}
        self._by_gpu: dict[str, list[Failure]] = {}
        self._known: set[Failure] = set()
        for f in failures:
            self.add(f)

    def add(self, f: Failure) -> bool:
        """Remember `f`; False when it is known already (an alert fed again after a restart)."""
        if f in self._known:
            return False
        self._known.add(f)
        if f.app_xid:
            if f.gpu is not None:
                self._by_gpu.setdefault(f.gpu, []).append(f)
        else:
            self._by_node.setdefault(f.node, []).append(f)
        return True

    def of_node(self, node: str, since: datetime) -> list[Failure]:
        """The node's drains for its own faults since `since`."""
        return [f for f in self._by_node.get(node, ()) if f.at >= since]

    def on_gpu(self, gpu: str, since: datetime) -> list[Failure]:
        """The application-class XIDs seen on the GPU since `since`."""
        return [f for f in self._by_gpu.get(gpu, ()) if f.at >= since]

    def forget(self, before: datetime) -> None:
        self._known = {f for f in self._known if f.at >= before}
        for index in (self._by_node, self._by_gpu):
            for key in list(index):
                kept = [f for f in index[key] if f.at >= before]
                if kept:
                    index[key] = kept
                else:
                    del index[key]

    def __len__(self) -> int:
        return sum(map(len, self._by_node.values())) + sum(map(len, self._by_gpu.values()))


@dataclass(frozen=True)
class NodeRecord:
    """One node's failures over a period: what `slurmedic nodes` and the console list."""

    node: str
    failures: int  # its drains for its own faults and the application XIDs on its GPUs
    drains: int
    app_xids: int
    causes: tuple[str, ...]  # what it was drained for, and `xid:31` for XIDs, most first
    gpus: tuple[str, ...]  # the GPUs its application XIDs were on
    jobs: int  # the jobs those failures hit
    first: datetime
    last: datetime
    # Failures within `window` of each other reaching `count`: a hardware suspect.
    suspect: bool


def distinct(drains: Iterable[tuple[datetime, bool]], apart: timedelta) -> list[datetime]:
    """The times of a node's drains (time, whether it ran) that are failures of their own: but
    for one less than `apart` after a drain that did not run (monitor mode's record left the
    node in service: XID 79, then the same GPU gone a few minutes on, is one fault alerting
    twice). After a drain that ran, the node failed again once back in service: a repeat."""
    out: list[tuple[datetime, bool]] = []
    for at, ran in sorted(drains):
        if out and not out[-1][1] and at - out[-1][0] < apart:
            continue
        out.append((at, ran))
    return [at for at, _ in out]


def lemons(
    failures: Iterable[Failure], window: timedelta, count: int, apart: timedelta = timedelta(0)
) -> list[NodeRecord]:
    """Each node's record, the lemons first (most failures, then the latest): in every published
    fleet a few nodes cause most of the exclusions. Drains less than `apart` apart are one
    failure to judge a suspect by."""
    by_node: dict[str, list[Failure]] = {}
    for f in failures:
        by_node.setdefault(f.node, []).append(f)
    records = []
    for node, mine in by_node.items():
        mine.sort(key=lambda f: f.at)
        drains = [f for f in mine if not f.app_xid]
        kinds: dict[str, int] = {}
        for f in mine:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        # A run of `count` drains (or application XIDs on one GPU) within the window.
        runs = [distinct(((f.at, f.ran) for f in drains), apart)]
        runs += [[f.at for f in run] for run in _by_gpu(mine).values()]
        suspect = any(
            len(run) >= count and run[i + count - 1] - run[i] <= window
            for run in runs
            for i in range(len(run) - count + 1)
        )
        records.append(
            NodeRecord(
                node=node,
                failures=len(mine),
                drains=len(drains),
                app_xids=len(mine) - len(drains),
                causes=tuple(sorted(kinds, key=lambda k: (-kinds[k], k))),
                gpus=tuple(sorted({f.gpu for f in mine if f.app_xid and f.gpu})),
                jobs=len({f.job for f in mine if f.job is not None}),
                first=mine[0].at,
                last=mine[-1].at,
                suspect=suspect,
            )
        )
    return sorted(records, key=lambda r: (-r.failures, -r.last.timestamp(), r.node))


def _by_gpu(failures: Iterable[Failure]) -> dict[str, list[Failure]]:
    """Application XIDs by GPU, one job each (the same job's repeats are one)."""
    found: dict[str, dict[int | None, Failure]] = {}
    for f in failures:
        if f.app_xid and f.gpu:
            found.setdefault(f.gpu, {}).setdefault(f.job, f)
    return {gpu: sorted(jobs.values(), key=lambda f: f.at) for gpu, jobs in found.items()}


# What a record must hold before the cluster's own failure rate replaces the policy's default:
# a month of it, and enough failures that chance moves the rate by less than a quarter.
LEARN_AFTER = timedelta(days=30)
LEARN_FROM = 16


def learned_rate(failures: int, nodes: int, span: timedelta) -> float | None:
    """The cluster's failure rate (per 1,000 node-days) from its own record: `failures` of its
    nodes' own faults over `span`; None while the record is too short or too thin to say."""
    if nodes <= 0 or span < LEARN_AFTER or failures < LEARN_FROM:
        return None
    return failures / (nodes * span.total_seconds() / 86400) * 1000
