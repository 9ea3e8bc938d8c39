"""What the core knows of the cluster: nodes, switches, jobs. Built by an adapter (Slurm, or a
scenario's snapshot); the core never asks Slurm itself."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Their home is patterns.py; the adapters and the core import them from here.
from webhook.core.patterns import JOB_ID as JOB_ID
from webhook.core.patterns import NODE_NAME as NODE_NAME

ACTIVE_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}
# Slurm's job base states (the rest of a state list, or squeue's word, are flags).
JOB_BASE_STATES = {
    "PENDING",
    "RUNNING",
    "SUSPENDED",
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
}
# Ends someone chose (scancel, the job's time limit or deadline, preemption): not faults.
ENDED_ON_PURPOSE = {"CANCELLED", "TIMEOUT", "DEADLINE", "PREEMPTED"}
# Slurm's base states of a node that can run a job (SlurmNode.state; replay's `alloc`).
IN_SERVICE = frozenset({"idle", "alloc", "allocated", "mixed"})
ENDED_STATES = {
    "NODE_FAIL",
    "FAILED",
    "TIMEOUT",
    "CANCELLED",
    "PREEMPTED",
    "BOOT_FAIL",
    "OUT_OF_MEMORY",
    "DEADLINE",
}

# Ends by a fault: what slurmedic recovers from.
FAILED_STATES = ENDED_STATES - ENDED_ON_PURPOSE
# Waiting to run (again): a requeued job's next attempt has not started in these.
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# Requeued by Slurm and held there after a run that ended (an expedited requeue's job that
# exited non-zero, RequeueExitHold's SPECIAL_EXIT): the run's exit code is kept.
HELD_STATES = frozenset({"REQUEUE_HOLD", "SPECIAL_EXIT"})


def _ran_at(job: Job, at: datetime) -> bool:
    if job.started is not None and job.started > at:
        return False
    if job.active:
        return True
    return job.ended is None or job.ended >= at


@dataclass(frozen=True)
class Node:
    name: str
    partition: str
    state: str = "idle"
    reason: str = ""
    switch: str | None = None
    # Further partitions the node belongs to (Slurm nodes may serve several).
    other_partitions: tuple[str, ...] = ()
    # sinfo's long state (`allocated*`, `drained`, `down*`, ...), for reporting: the core
    # decides on `state`.
    status: str = ""
    # GPUs the node has (its `gpu` gres); 0 when Slurm names none. What a drain takes out of
    # service, and what a job on the node holds.
    gpus: int = 0
    # Slurm holds a reboot of it (asked for, or under way): it has not registered since.
    rebooting: bool = False
    # The machine it runs on when that is not its own name (Slinky: its slurmd pod's Kubernetes
    # node); alerts that name that machine are about this node (ClusterView.hosts).
    host: str = ""

    @property
    def hosted(self) -> bool:
        """It runs on a machine of another name (`host`): a Slinky pod."""
        return bool(self.host) and self.host != self.name

    @property
    def partitions(self) -> tuple[str, ...]:
        return (self.partition, *self.other_partitions)

    @property
    def in_service(self) -> bool:
        """It can take a job: idle, allocated or mixed, responding (no `*`), and not in
        maintenance, a reservation or invalid."""
        return (
            self.state in IN_SERVICE
            and not self.status.endswith("*")
            and not self.status.startswith(("maint", "reserved", "inval"))
        )


@dataclass(frozen=True)
class Job:
    id: int
    nodes: tuple[str, ...]
    partition: str = ""
    name: str = ""
    user: str = ""
    # Its Slurm account (empty: Slurm names none, as without accounting): with the user, whom
    # slurmedic's notices name as the job's owner (webhook/core/notices.py).
    account: str = ""
    state: str = "RUNNING"
    requeue: bool = True
    restarts: int = 0
    comment: str = ""
    started: datetime | None = None
    ended: datetime | None = None
    # Slurm's base state when `state` names a flag (CANCELLED while the job is COMPLETING);
    # empty when it is `state`, or unknown (22.05 prints one word).
    base: str = ""
    # The nodes the job may not run on (its ExcNodeList): its owner's `--exclude`, a person's,
    # and slurmedic's own requeues'.
    excluded: frozenset[str] = frozenset()
    # The exit code of its batch script once it ended, or of the run Slurm requeued it from and
    # holds it after (None while it runs, or when a signal ended it): a workload's own word,
    # such as NVRx's 93 "do not restart me".
    exit_code: int | None = None

    @property
    def attempt(self) -> str:
        return f"{self.id}.{self.restarts}"

    # What Slurm's state says of the job. `ended` is taken (when it ended, if it did): hence
    # `has_ended`.
    @property
    def active(self) -> bool:
        """Running, or holding its nodes (completing, configuring, suspended)."""
        return self.state in ACTIVE_STATES

    @property
    def waiting(self) -> bool:
        """Waiting to run, or to run again: its current attempt has not started. Also while
        the attempt Slurm requeued is still COMPLETING (its base state PENDING already, its
        restart count the next attempt's)."""
        return self.state in WAITING_STATES or self.base in WAITING_STATES

    @property
    def has_ended(self) -> bool:
        """No longer running nor waiting to (completed, failed, cancelled, requeued...)."""
        return not self.active and self.state != "PENDING"

    @property
    def held(self) -> bool:
        """Requeued and held by Slurm after its run ended (HELD_STATES): waiting for a release,
        its exit code the ended run's."""
        return self.state in HELD_STATES

    @property
    def interrupted(self) -> bool:
        """Ended before it completed, by a fault or by choice (FAILED, NODE_FAIL, CANCELLED,
        TIMEOUT...): Slurm's state itself, not a flag's base state."""
        return self.state in ENDED_STATES

    @property
    def ended_on_purpose(self) -> bool:
        """Cancelled, timed out, past its deadline or preempted: ended, or ending, by choice."""
        return bool({self.state, self.base} & ENDED_ON_PURPOSE)

    @property
    def failed(self) -> bool:
        """Ended by a fault (FAILED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL), or ending so."""
        return bool({self.state, self.base} & FAILED_STATES) and not self.ended_on_purpose

    @property
    def completed(self) -> bool:
        return "COMPLETED" in (self.state, self.base)

    def options(self) -> dict[str, Any]:
        """The job's slurmedic options from its comment JSON (other comments are ignored)."""
        try:
            data = json.loads(self.comment)
        except (ValueError, TypeError):
            return {}
        opts = data.get("slurmedic") if isinstance(data, dict) else None
        return opts if isinstance(opts, dict) else {}


def eligible(job: Job) -> bool:
    """Eligible to run, for goodput (ETTR): running, or waiting again after it has run (a
    requeue). The wait before the first start is the queue's, not a failure's."""
    if job.active:
        return True
    return job.state in WAITING_STATES and job.restarts > 0


@dataclass
class ClusterView:
    nodes: dict[str, Node] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    switches: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _by_node: dict[str, list[Job]] | None = field(default=None, repr=False, compare=False)
    _by_host: tuple[int, dict[str, str]] | None = field(default=None, repr=False, compare=False)

    @property
    def hosts(self) -> dict[str, str]:
        """The node on each machine that holds exactly one (Node.host): a machine with two
        Slurm nodes on it names neither, as an alert about its GPUs cannot say which. Made
        again when nodes are added."""
        if self._by_host is None or self._by_host[0] != len(self.nodes):
            on: dict[str, list[str]] = {}
            for n in self.nodes.values():
                if n.hosted:
                    on.setdefault(n.host, []).append(n.name)
            self._by_host = (
                len(self.nodes),
                {host: names[0] for host, names in on.items() if len(names) == 1},
            )
        return self._by_host[1]

    def set_job(self, job: Job) -> None:
        self.jobs[job.id] = job
        self._by_node = None

    def valid_node(self, name: str) -> bool:
        return bool(NODE_NAME.match(name)) and name in self.nodes

    def _held(self, node: str) -> list[Job]:
        """Every job the view places on `node`, whatever its state."""
        if self._by_node is None:
            index: dict[str, list[Job]] = {}
            for j in self.jobs.values():
                for n in j.nodes:
                    index.setdefault(n, []).append(j)
            self._by_node = index
        return self._by_node.get(node, [])

    def jobs_on(self, node: str, at: datetime | None = None) -> list[Job]:
        """Jobs that held `node` at `at` (now, without `at`).

        A job that has ended since (NODE_FAIL, FAILED, ...) still counts when it ended at or
        after `at`, or when Slurm did not say when: the alert may arrive after Slurm noticed.
        """
        return [
            j
            for j in self._held(node)
            if (j.active or j.interrupted) and (j.active if at is None else _ran_at(j, at))
        ]

    def failed_on(self, node: str, after: datetime, before: datetime) -> list[Job]:
        """Jobs whose attempt on `node` failed (a fault, not by choice) between `after` and
        `before`, with no job started there since, and that Slurm still shows so (not
        requeued since)."""
        held = self._held(node)
        return [
            j
            for j in held
            if j.failed
            and j.ended is not None
            and after <= j.ended <= before
            and not any(
                o.started is not None and j.ended < o.started <= before for o in held if o is not j
            )
        ]

    def switch_of(self, node: str) -> str | None:
        return self.nodes[node].switch if node in self.nodes else None
