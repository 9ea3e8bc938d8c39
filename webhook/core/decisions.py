"""Decisions: what they are, what each cause leads to (docs/operations.md's table: `plan`), and what
the guards remember between incidents (`GuardState`, changed only by `Effect`s).

Act on failures, not symptoms: an application's GPU error (an XID of the application class) on a
job that keeps running is recorded and told to people, and the job is left alone until it has
failed (it ended, a rank logged a fatal error, or its progress stalled). A job that died of
timeouts or communication errors with nobody to blame (cause unknown, or a hang: every rank
timed out) is requeued once; the same again is for a human, and when it failed first on the same
node again, that node is named. A job that stalls while it still runs is requeued (a hang) within
its retry budget.

The guards that may change a plan's decisions, in their order, are webhook.core.guards.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, assert_never

from webhook.core.attribution import Attribution, names
from webhook.core.cluster import Job
from webhook.core.evidence import Evidence
from webhook.core.failures import FailureMemory
from webhook.core.history import HistoryIndex
from webhook.core.incidents import judged_attempt
from webhook.core.lifecycle import (
    EXECUTED,
    INITIAL,
    PENDING,
    RECORDED,
    REFUSED,
    REJECTED,
    State,
)
from webhook.core.policy import SHARED, Policy
from webhook.core.signals import FAILURE_SIGNALS

DRAIN_CAUSES = {"gpu_hardware", "node_failure", "network", "degraded", "straggler"}
# A new fault in hardware (a GPU, a host, a link): a requeue for one starts the job's run of
# failed restarts afresh. A job of thousands of nodes meets one every few hours whatever its
# progress; a restart that died of one is not the job failing to make progress.
FAULT_CAUSES = frozenset({"gpu_hardware", "node_failure", "network", "degraded"})
# The cluster's failures, not the job's: what slurmedic blames on nodes it drains, and a shared
# cause it requeues jobs away from. A requeue for one takes the failure's nodes out of the
# job's reach (`removes`).
CLUSTER_CAUSES = frozenset({*DRAIN_CAUSES, SHARED})
SCHEDULER_ACTIONS = frozenset({"drain", "requeue", "stop", "resume"})  # the ones that change Slurm
JOB_ACTIONS = frozenset({"requeue", "stop"})  # the ones that interrupt a job
NODE_REPAIRS = frozenset({"reset_gpu", "reboot"})  # the repairs that change a node
# Causes that blame nobody: a job that died of them is requeued once, then given to a human.
BLAMELESS = frozenset({"unknown", "hang"})


@dataclass(frozen=True)
class Decision:
    at: datetime
    incident: str
    job: int | None
    action: str
    cause: str
    reason: str
    nodes: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    evidence: tuple[dict[str, Any], ...] = ()
    guard: str | None = None
    mode: str = "monitor"
    # A requeue's nodes that earlier requeues of the job excluded and that are in service
    # again: taken out of its ExcNodeList (guards.readmit). Not part of the replay contract's
    # output (its reason says it).
    readmit: tuple[str, ...] = ()
    state: str = "recorded"
    # 0 for an incident's first decisions; a later revision supersedes the ones before it.
    revision: int = 0
    # The partition whose modes it took (the job's, or an idle node's only one); None: none.
    partition: str | None = None
    # What it would disrupt (webhook/core/disruption.py): GPUs it takes out of service or
    # interrupts, and for a requeue or stop the GPU-hours the attempt had run. Not part of
    # the replay contract's output.
    gpus: int = 0
    gpu_hours: float | None = None
    # A drain's words for Slurm's reason after its key and cause (`repeat 2 in 7d`). Not part
    # of the replay contract's output (its reason says it).
    note: str = ""
    # A requeue for a failure nobody could be blamed for, or for one rank's crash: where it
    # failed (requeue_once reads it back, the same there again implicates that node). Not part
    # of the replay contract's output.
    failed_on: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "incident": self.incident,
            "job": self.job,
            "action": self.action,
            "nodes": sorted(self.nodes),
            "exclude": sorted(self.exclude),
            "cause": self.cause,
            "reason": self.reason,
            "evidence": list(self.evidence),
            "guard": self.guard,
            "mode": self.mode,
            "state": self.state,
        }


GLOBAL_SWITCH = "global_switch"  # the guard of a decision made a record by the global switch


@dataclass(frozen=True)
class PastAction:
    """An earlier decision, as the ledger holds it (for budgets and the breaker)."""

    at: datetime
    action: str
    job: int | None = None
    nodes: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    cause: str = ""
    # requeue: the nodes it took back out of the job's ExcNodeList (guard stage readmit)
    readmit: tuple[str, ...] = ()
    # recovery_failed: whether the successor failed before writing its first checkpoint
    before_checkpoint: bool = False
    # The incident that decided it ("" when unknown: a scenario's history); a failed recovery's
    # is the recovery check's (`verify:1001.3`), which names the attempt it judged.
    incident: str = ""
    # Never carried out (a human rejected it, or nobody approved it in time): the guards do not
    # count it, and a rejected requeue excluded nothing. A drain's record stays for `readmit`:
    # its requeue's exclusion of the node (when that ran) is taken back as any other.
    undone: bool = False
    # Not carried out (yet), and no person said it should not be: a record (monitor mode, the
    # global switch), waiting for approval or to run, expired, failed. A held drain's node is in
    # service only because nobody has looked at it: `readmit` does not take it back.
    held: bool = False

    @property
    def rejected(self) -> bool:
        """A person said no: the node it would have drained is fine, as far as anyone knows."""
        return self.undone and not self.held


@dataclass(frozen=True)
class Counted:
    """An action the guards count from now on: one more drain in the breaker's window, one more
    requeue spent from the job's retry budget."""

    action: PastAction


@dataclass(frozen=True)
class BreakerOpened:
    """The circuit breaker opens; only a human resets it."""


# What a guard does to the guards' memory, said instead of done: the engine applies it.
Effect = Counted | BreakerOpened


@dataclass
class GuardState:
    """What the guards remember between incidents: history, the breaker, and the application
    XIDs seen on each GPU (webhook.core.failures)."""

    history: list[PastAction] = field(default_factory=list)
    breaker_open: bool = False
    # Drains before a human's reset do not count against the breaker any more.
    breaker_reset_at: datetime | None = None
    # When the record behind `history` begins (the ledger's first notification): what happened
    # before it is unknown. None: the whole story is here (a replay).
    memory_since: datetime | None = None
    # The global switch to monitor (`slurmedic switch monitor`): every decision is a record.
    monitor_forced: bool = False
    gpu_faults: FailureMemory = field(default_factory=FailureMemory, compare=False)

    # Follows `history` (a plain list others append to or replace), by job and by drain time.
    _index: HistoryIndex[PastAction] = field(
        default_factory=HistoryIndex, init=False, repr=False, compare=False
    )
    # A revision's copy (`without`): the escalations its parent remembers, but the incident's
    # own, so that telling of a storm costs what the escalations do, not an index of the copy.
    _told: list[PastAction] | None = field(default=None, init=False, repr=False, compare=False)

    def requeues(
        self, job: int, since: datetime, deciding: str = "", removing: bool | None = None
    ) -> int:
        """Requeues of the job, and its failed recoveries that no requeue counts: each failure
        spends the budget once. With `removing`, only the requeues that took the failure's
        nodes out of the job's reach (`removes`), or only the others and the failed recoveries
        (the job's own failures, what a crash loop spends).

        A failed recovery (`verify:1001.3`: attempt 1001.4 failed) is counted by the requeue
        for that attempt's failure (`1001.4`), made before or being decided now (`deciding`);
        counting both spent a crash loop's budget twice as fast, and a GPU fault then stopped
        the job. One with no attempt on record (a scenario's history) is counted by any
        requeue after it."""
        mine = self._index.of_job(self.history, job)
        requeued = {h.incident for h in mine if h.action == "requeue"} | {deciding}
        last = max((h.at for h in mine if h.action == "requeue"), default=None)

        def recounted(h: PastAction) -> bool:
            attempt = judged_attempt(h.incident)
            if attempt is None:
                return last is not None and h.at < last
            return attempt in requeued

        return sum(
            1
            for h in mine
            if h.at >= since
            and (
                removing is None
                or (h.action == "requeue" and removes(h.cause, h.exclude)) == removing
            )
            and (h.action == "requeue" or (h.action == "recovery_failed" and not recounted(h)))
        )

    def failed_recoveries(self, job: int, since: datetime, *, before_checkpoint: bool) -> int:
        """The job's failed recoveries in a row: since `since`, its last good one and its last
        requeue for a new hardware fault (the restart that fault ended is not counted either:
        the requeue comes after the failed recovery it follows)."""
        mine = self._index.of_job(self.history, job)
        since = max(
            [
                since,
                *(
                    h.at
                    for h in mine
                    if h.action == "recovered"
                    or (h.action == "requeue" and h.cause in FAULT_CAUSES)
                ),
            ]
        )
        return sum(
            1
            for h in mine
            if h.action == "recovery_failed"
            and h.at >= since
            and (h.before_checkpoint or not before_checkpoint)
        )

    def drained(self, since: datetime) -> Collection[str]:
        """The nodes drained since `since` (and since the breaker's last reset)."""
        if self.breaker_reset_at is not None:
            since = max(since, self.breaker_reset_at)
        return self._index.drained(self.history, since).keys()

    def apply(self, effects: Iterable[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Counted):
                self.history.append(effect.action)
            elif isinstance(effect, BreakerOpened):
                self.breaker_open = True
            else:
                assert_never(effect)

    def reset_breaker(self, at: datetime) -> None:
        self.breaker_open = False
        self.breaker_reset_at = at

    def without(self, incident: str) -> GuardState:
        """A copy that forgets one incident's own actions, to try a revision of it: but for
        those that ran (a drain of degraded hardware that left the job running: the revision
        cannot undo it)."""
        copy = GuardState(
            history=[
                h
                for h in self.history
                if not (incident and h.incident == incident and (h.held or h.undone))
            ],
            breaker_open=self.breaker_open,
            breaker_reset_at=self.breaker_reset_at,
            memory_since=self.memory_since,
            monitor_forced=self.monitor_forced,
            gpu_faults=self.gpu_faults,
        )
        copy._told = [h for h in self._escalations(None) if h.incident != incident]
        return copy

    def _escalations(self, since: datetime | None) -> list[PastAction]:
        if self._told is not None:
            return [h for h in self._told if since is None or h.at >= since]
        return self._index.escalations(self.history, since)

    def settle(self, states: Mapping[tuple[str, str, datetime], str]) -> None:
        """What became of decisions (incident, action, time -> their state now). Rejected and
        expired ones never run: no longer counted (`undone`). Those not run (yet) are
        `held`."""
        if not states:
            return
        settled = [_settled(h, states.get((h.incident, h.action, h.at))) for h in self.history]
        if settled != self.history:  # the history index is built anew only for a change
            self.history = settled

    def adopt(self, trial: GuardState) -> None:
        """Take a revision's guard state (its actions replace the incident's earlier ones)."""
        self.history, self.breaker_open = trial.history, trial.breaker_open
        self._index = trial._index

    def _exclusions(self, job: int) -> dict[str, PastAction]:
        """Each node the job's earlier requeues excluded, and none readmitted since: the
        requeue that excluded it last."""
        last: dict[str, PastAction] = {}
        mine = (h for h in self._index.of_job(self.history, job) if h.action == "requeue")
        for h in sorted(mine, key=lambda h: h.at):
            for n in h.readmit:
                last.pop(n, None)
            last.update(dict.fromkeys(h.exclude, h))
        return last

    def excluded(self, job: int) -> set[str]:
        """The nodes the job's earlier requeues excluded and none readmitted since: Slurm keeps
        them for every attempt."""
        return set(self._exclusions(job))

    def ever_excluded(self, job: int) -> set[str]:
        """Every node the job's requeues excluded, readmitted since or not: a node readmitted
        stays in the view's ExcNodeList until the requeue has run and the view is read again,
        and is not the owner's for that."""
        mine = self._index.of_job(self.history, job)
        return {n for h in mine if h.action == "requeue" for n in h.exclude}

    def exclusions_in_force(self, before: datetime, jobs: Collection[int]) -> list[PastAction]:
        """The actions older than `before` that say what Slurm still excludes for these jobs
        (their requeues' exclusions, and the drains of those nodes): Slurm keeps a job's
        ExcNodeList for as long as the job lives, so `readmit` and `room` need them past any
        window."""
        old = [h for h in self.history if h.at < before]
        kept = [
            h for h in old if h.action == "requeue" and (h.exclude or h.readmit) and h.job in jobs
        ]
        nodes = {n for h in kept for n in h.exclude}
        drains = [h for h in old if h.action == "drain" and not nodes.isdisjoint(h.nodes)]
        return sorted([*kept, *drains], key=lambda h: h.at)

    def readmittable(
        self, job: int, settled: datetime, switch_before: datetime
    ) -> tuple[set[str], set[str]]:
        """What of the job's exclusions (its earlier requeues', none readmitted since) may be
        taken back once in service, in two parts:

        - drained: the nodes the same incident drained, or a later drain did (back in
          service, someone resumed them: repaired), or whose drain a person rejected; a `held`
          drain (not run, and nobody looked) is none of these; not while a later drain of the
          node (another failure) is held or younger than `settled`;
        - off a switch: the nodes excluded off a failing switch (a shared cause) before
          `switch_before`, that no drain took out with the exclusion or since.

        A node excluded without a drain of its own and not off a switch is in neither: in
        service, its fault may still be there."""
        why = self._exclusions(job)
        drains = self._drains_of(why.keys())
        drained = {
            n
            for n, req in why.items()
            # Its own drain, or a later one, ran (a person resumed the node since), or a person
            # rejected it.
            if any(
                (h.incident == req.incident or h.at > req.at) and not h.held
                for h in drains.get(n, ())
            )
            and not any(
                h.incident != req.incident
                and h.at > req.at
                and not h.rejected
                and (h.at >= settled or h.held)
                for h in drains.get(n, ())
            )
        }
        switch = {
            n
            for n, req in why.items()
            if req.cause == SHARED
            and req.at < switch_before
            and not any(
                not h.rejected and (h.incident == req.incident or h.at > req.at)
                for h in drains.get(n, ())
            )
        }
        return drained, switch

    def _drains_of(self, nodes: Collection[str]) -> dict[str, list[PastAction]]:
        return {n: self._index.drains_of(self.history, n) for n in nodes}

    def of_job(self, job: int, since: datetime) -> list[PastAction]:
        """The job's actions since `since` (carried out or counted so)."""
        return [h for h in self._index.of_job(self.history, job) if h.at >= since]

    def requeue_for(self, job: int, cause: str, since: datetime | None) -> PastAction | None:
        """The job's last requeue for `cause` ("": any) since `since` (None: ever), if any."""
        found = [
            h
            for h in self._index.of_job(self.history, job)
            if h.action == "requeue"
            and (not cause or h.cause == cause)
            and (since is None or h.at >= since)
        ]
        return max(found, key=lambda h: h.at) if found else None

    def recovered_since(self, job: int, at: datetime) -> bool:
        """Whether a recovery check saw the job train again after `at`."""
        return any(
            h.action == "recovered" and h.at > at for h in self._index.of_job(self.history, job)
        )

    def storm_told(self, nodes: Collection[str], since: datetime) -> PastAction | None:
        """An escalation of a shared cause since `since` that named any of these nodes: the
        storm a person was already told of."""
        wanted = set(nodes)
        found = [
            h
            for h in self._escalations(since)
            if h.cause == SHARED and not wanted.isdisjoint(h.nodes)
        ]
        return min(found, key=lambda h: h.at) if found else None

    def earlier_drains(self, node: str, since: datetime, incident: str) -> list[PastAction]:
        """The node's drains for its own faults since `since`, by other incidents, that a
        person did not reject (monitor's and held ones too: they show what enforce does)."""
        return [
            h
            for h in self._index.drains_of(self.history, node)
            if h.at >= since
            and h.incident != incident
            and not h.rejected
            and h.cause in DRAIN_CAUSES
        ]

    def blameless_requeue(self, job: int, since: datetime) -> PastAction | None:
        """The job's last requeue for a failure nobody could be blamed for, if any."""
        found = [
            h
            for h in self._index.of_job(self.history, job)
            if h.action == "requeue" and h.cause in BLAMELESS and h.at >= since
        ]
        return max(found, key=lambda h: h.at) if found else None


LEFT_RUNNING = "job_running"  # the guard of a `none` that leaves a job running on purpose


def leaves_running(d: Decision) -> bool:
    """A `none` that leaves the job running on purpose (an application's symptom, degraded
    hardware, a slow job waiting for its checkpoint): its incident keeps watching the job."""
    return d.action == "none" and d.guard == LEFT_RUNNING


def closes(carried: Iterable[str], standing: Iterable[Decision]) -> bool:
    """Whether actions carried out close an incident whose decisions in force are `standing`
    (no more revisions: what arrives later is their consequence). A drain whose decisions left
    the job running on purpose (degraded hardware: Slurm lets it finish) does not: the job's
    failure there is news."""
    done = set(carried) & SCHEDULER_ACTIONS
    if any(map(leaves_running, standing)):
        return bool(done & JOB_ACTIONS)
    return bool(done)


def removes(cause: str, exclude: Collection[str]) -> bool:
    """Whether a requeue takes the failure's nodes out of the job's reach: the cluster's failure
    (nodes blamed and drained, a failing switch), or any requeue that excludes nodes. Such a
    failure cannot loop (its nodes are gone from the job), so its requeues have a budget of
    their own, scaled with the job's size (Policy.hardware_requeues); a requeue that removes
    nothing is the same failure again if it recurs: a crash loop (retry_budget.max_requeues)."""
    return cause in CLUSTER_CAUSES or bool(exclude)


def job_failed(job: Job, evidence: Iterable[Evidence]) -> bool:
    """Whether the job has failed: it ended by a fault, a rank logged a fatal error, or it
    stalled. A job that completed, or that someone ended, has not."""
    if job.completed or job.ended_on_purpose:
        return False
    return job.failed or any(e.signal in FAILURE_SIGNALS and e.actionable for e in evidence)


def died_blameless(cause: str, job: Job) -> bool:
    """It died of timeouts or communication errors and nobody is to blame: requeued once."""
    return cause in BLAMELESS and job.failed


def first_failing(evidence: Iterable[Evidence]) -> Evidence | None:
    """The evidence that started first and names a node: where the failure began."""
    named = [e for e in evidence if e.actionable and e.node]
    return min(named, key=lambda e: (e.starts_at, e.node or "")) if named else None


def away(base: Decision, attr: Attribution, job: Job | None, *, failed: bool) -> list[Decision]:
    """shared_cause.requeue_away, for a job that has `failed` of a switch's fault: requeued
    now, off every node of the failing switch and off those drained apart (the guards may
    still hold it back; they never turn it into a stop)."""
    if not (failed and job is not None and attr.avoid):
        return []
    off = tuple(sorted({*attr.nodes, *attr.avoid}))
    drained = f" and {names(attr.nodes)}, drained" if attr.nodes else ""
    why = (
        f"{attr.shared or attr.reason}; job {job.id} has failed: requeued off the failing "
        f"switch ({names(attr.avoid)}){drained}; the switch is left to a person"
    )
    return [replace(base, action="requeue", cause=SHARED, exclude=off, reason=why)]


def plan(
    base: Decision, attr: Attribution, job: Job | None, *, requeue_away: bool = False
) -> list[Decision]:
    """docs/operations.md's table: what the cause leads to, before any guard has spoken (the guards,
    webhook.core.guards, may change each of these). `requeue_away`: the policy's
    shared_cause.requeue_away is on and the job has failed (`job_failed`)."""
    out: list[Decision] = []
    if attr.cause in DRAIN_CAUSES and attr.nodes:
        out.append(replace(base, action="drain", nodes=attr.nodes))
    if attr.shared:  # some nodes drained, the rest is a shared cause: a human decides the job
        why = f"{attr.shared}; {names(attr.nodes)} drained apart"
        out += away(base, attr, job, failed=requeue_away)
        return [*out, replace(base, action="escalate", cause=SHARED, reason=why)]
    if job is None:  # a node incident: no job to touch
        if not out and attr.cause in (SHARED, "unknown"):
            return [replace(base, action="escalate")]
        return out
    requeue = replace(base, action="requeue", exclude=attr.nodes)
    if attr.cause == SHARED:
        out += away(base, attr, job, failed=requeue_away)
        out.append(replace(base, action="escalate"))
    elif attr.cause in DRAIN_CAUSES:
        out.append(requeue)  # away from the nodes to blame, from its checkpoint
    elif attr.cause == "application":
        # Stopped once it has failed (the job_running guard holds it back until then): a job
        # that crashed by its own fault on every rank alike would crash again, unless its owner
        # asks for retries. One rank's crash (the others timed out waiting for it) is
        # restarted once, its owner told (requeue_once stops it the same way again).
        retry = job.options().get("retry_application") is True
        if attr.partial and not retry:
            told = f"{attr.reason}; its owner should look at the failing rank"
            out += [requeue, replace(base, action="escalate", reason=told)]
        else:
            out.append(requeue if retry else replace(base, action="stop"))
    elif attr.cause == "hang" or died_blameless(attr.cause, job):
        # Nobody to blame: a restart from the checkpoint is the cheapest way out; once only,
        # when the job died of it (the requeue_once guard).
        out.append(requeue)
    else:
        out.append(replace(base, action="escalate"))
    return out


def with_mode(
    d: Decision, policy: Policy, partition: str | None = None, *, forced: bool = False
) -> Decision:
    """The decision in the mode the policy gives its action (for its cause, on its partition),
    and the state that mode starts in. `forced`: the global switch holds everything in monitor
    mode."""
    mode = "monitor" if forced else policy.mode_of(d.action, partition, d.cause)
    return replace(d, mode=mode, state=initial_state(d.action, mode), partition=partition)


def initial_state(action: str, mode: str) -> State:
    """The state a decision starts in. Approve mode holds what would change Slurm for a human;
    an escalation changes nothing and is itself the hand-over to a human (its notice), so it
    is carried out at once, as in enforce mode."""
    if action == "none":
        return RECORDED
    if mode == "approve" and action not in SCHEDULER_ACTIONS | NODE_REPAIRS:
        return PENDING
    return INITIAL[mode]


def held(state: str) -> bool:
    """Whether a decision in `state` has not run, and no person rejected it (PastAction.held):
    waiting for approval or to run, running, expired unapproved, failed, or only a record
    (monitor mode, or the global switch)."""
    return state not in (EXECUTED, REJECTED)


def _settled(h: PastAction, state: str | None) -> PastAction:
    if state is None:
        return h
    return replace(h, undone=h.undone or state in REFUSED, held=held(state))
