"""The repair of a node slurmedic drained: what its evidence calls for, and each step after the
last (pure).

A node slurmedic drained for its own fault goes, once no job runs on it (Slurm shows it
DRAINED, not DRAINING), through

    waiting -> repairing (reset_gpu | reboot) -> checking (health_check) -> resuming (resume)
            -> probation -> done

The repair is the one NVIDIA's XID catalog gives the fault's class as its immediate action: a GPU
reset (RESET_GPU, the XID-48 and NVLink workflows, a contained error's "reset when
convenient"), a reboot (RESTART_BM, RESTART_VM, and a node that went down or stopped
answering), or only the health check (a straggler: nothing says what to repair). What no
automatic step mends goes to a person for replacement (`replace`, escalated), never to a reboot:
CONTACT_SUPPORT, CHECK_MECHANICALS and UPDATE_SWFW codes, the codes with no action yet, a failed
row remap, a GPU too hot to trust (its cooling), a node that failed again after an earlier repair
(within the repeat window), and a node whose repair budget is spent (NVSentinel's users report
reset and reboot loops as the repair's commonest failure).

A repair ends when a person takes the node over (`ended`: resumed, drained with their own reason,
or any step they rejected), when its check fails (`replace`, with the check's output), and when
the node is back in service (`probation`: its first job watched until the repeat window is over;
failing within it sends the node to replacement).

A repair of a drain that did not run (monitor mode recorded it) changes nothing either: each step
is a dry run, recorded one after the other, so that an operator reads every command the loop
would run before enabling it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final, Literal

from webhook.core.cluster import Node
from webhook.core.decisions import Decision, with_mode
from webhook.core.incidents import REASON, IncidentKey
from webhook.core.lifecycle import EXECUTED, FAILED, OPEN, RECORDED, REFUSED, RUNNING
from webhook.core.policy import Policy

# NVIDIA's catalog's immediate action for each XID that takes a node out of service
# (alert_rules/xid-classes.yml's `node` and `contained` codes), as the repair it calls for;
# tests/unit/test_repairs.py holds these to the catalog. Every other such code: a person.
RESET_XIDS: Final = frozenset(
    {46, 48, 62, 64, 74, 94, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158}
    | set(range(144, 151))
)
REBOOT_XIDS: Final = frozenset({79, 151})

Plan = Literal["reset_gpu", "reboot", "health_check", "replace"]
# The strongest plan of a node's alerts wins: a GPU to replace is not mended by a reboot.
STRENGTH: Final[dict[str, int]] = {"health_check": 0, "reset_gpu": 1, "reboot": 2, "replace": 3}

# By alert, what its fault calls for (the XID alerts by their code, above).
BY_ALERT: Final[dict[str, Plan]] = {
    "GpuDoubleBitEccErrors": "reset_gpu",  # the XID-48 workflow: alone, a reset
    "GpuRowRemapPending": "reset_gpu",  # a pending remap takes effect at the next reset
    "GpuUncorrectableRemappedRows": "reset_gpu",
    "GpuRowRemapFailure": "replace",  # the GPU is out of spare rows
    "GpuMissing": "reboot",  # fell off the bus: XID 79's RESTART_BM
    "GpuNvlinkErrors": "reset_gpu",
    "GpuPcieReplays": "reset_gpu",
    "GpuXidContainedError": "reset_gpu",
    "TrainingXidContainedError": "reset_gpu",
    "GpuThrottled": "replace",  # its cooling or power: a person's
    "SlurmNodeDown": "reboot",
    "TrainingHeartbeatMissed": "reboot",
}
XID_ALERTS: Final = frozenset({"GpuXidNodeFault", "TrainingXidNodeFault"})
# By the drain's cause, when none of its alerts says more.
BY_CAUSE: Final[dict[str, Plan]] = {
    "gpu_hardware": "reboot",
    "node_failure": "reboot",
    "degraded": "reset_gpu",
    "network": "reboot",
    "straggler": "health_check",
}

State = Literal[
    "waiting", "repairing", "checking", "resuming", "probation", "done", "replace", "ended"
]
WAITING: Final = "waiting"
REPAIRING: Final = "repairing"
CHECKING: Final = "checking"
RESUMING: Final = "resuming"
PROBATION: Final = "probation"
DONE: Final = "done"
REPLACE: Final = "replace"
ENDED: Final = "ended"
# The moves a repair may make (h11's `_state.py` shape): a move not in the table is an error.
TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    WAITING: frozenset({REPAIRING, CHECKING, REPLACE, ENDED}),
    REPAIRING: frozenset({CHECKING, REPLACE, ENDED}),
    CHECKING: frozenset({RESUMING, REPLACE, ENDED}),
    RESUMING: frozenset({PROBATION, REPLACE, ENDED}),
    PROBATION: frozenset({DONE, REPLACE}),
    DONE: frozenset(),
    REPLACE: frozenset(),
    ENDED: frozenset(),
}
STATES: Final = frozenset(TRANSITIONS)
# Under repair: what the cap on nodes in repair at once counts (probation is back in service).
IN_REPAIR: Final = frozenset({REPAIRING, CHECKING, RESUMING})
UNDER_WAY: Final = frozenset({WAITING, *IN_REPAIR})
CLOSED: Final = frozenset({DONE, REPLACE, ENDED})
STEPS: Final = ("reset_gpu", "reboot", "health_check", "resume")
NODE_STEPS: Final = frozenset({"reset_gpu", "reboot"})
REPLACE_GUARD: Final = "replace_node"  # the guard of an escalation for replacement
# How long after its drain ran a node may still show in service: the view lags by a refresh.
VIEW_LAG: Final = timedelta(minutes=2)


class IllegalMove(ValueError):
    """A repair move that is not in TRANSITIONS."""


@dataclass(frozen=True)
class Drained:
    """A drain of a node for its own fault, as the ledger recorded it."""

    node: str
    drain: int  # the drain decision's id
    incident: str  # the drain's incident key
    cause: str
    at: datetime
    ran: bool  # executed; False: a dry run (monitor mode) or not carried out yet
    alerts: tuple[tuple[str, int | None], ...] = ()  # (alertname, its XID) of its evidence
    partition: str | None = None


@dataclass(frozen=True)
class Step:
    """One step's decision, as the ledger holds it."""

    id: int
    action: str
    state: str
    at: datetime  # when it was decided
    done_at: datetime | None = None  # when its run ended (executed or failed, or its dry run)
    passed: bool | None = None  # a health check's verdict, once it ran
    detail: str = ""  # what its run said: a failure's why, a check's output


@dataclass(frozen=True)
class Repair:
    node: str
    seq: int  # the node's n-th repair
    drained: Drained
    plan: Plan
    why: str  # why this plan
    started: datetime
    state: str = WAITING
    since: datetime | None = None  # when it entered its state
    steps: tuple[Step, ...] = ()

    @property
    def key(self) -> str:
        return str(IncidentKey.repairing(self.node, self.seq))

    @property
    def dry_run(self) -> bool:
        """Its drain did not run: every step only records what it would do."""
        return not self.drained.ran

    @property
    def tried(self) -> bool:
        """A reset or reboot of it ran (or was tried and failed): what the budget counts."""
        return any(s.action in NODE_STEPS and s.state in (EXECUTED, FAILED) for s in self.steps)

    def last(self, action: str) -> Step | None:
        found = [s for s in self.steps if s.action == action]
        return found[-1] if found else None

    def moved(self, state: str, at: datetime) -> Repair:
        if state != self.state and state not in TRANSITIONS[self.state]:
            raise IllegalMove(f"repair {self.key}: {self.state} -> {state}")
        return replace(self, state=state, since=at)


@dataclass(frozen=True)
class Move:
    """What one look at a repair gives: its next state, the decision that takes it there (if
    any), and why."""

    state: str
    reason: str
    decision: Decision | None = None


# When a node was out of service: from, until (None: still).
Window = tuple[datetime, datetime | None]


def out_of_service(repair: Repair) -> Window | None:
    """When the repair itself had its node out of service: from its first step (a reset, a
    reboot or a check slurmedic asked for) to the end of its resume, still open while it is under
    way; a repair closed without a resume (sent to a person, ended) until it closed. None: it only
    dry-ran (monitor mode touched nothing), or has taken no step yet."""
    steps = [s for s in repair.steps if s.action in STEPS]
    if repair.dry_run or not steps:
        return None
    resume = repair.last("resume")
    if resume is not None and resume.done_at is not None:
        return steps[0].at, resume.done_at
    return steps[0].at, None if repair.state in UNDER_WAY else repair.since


def plan_for(drained: Drained) -> tuple[Plan, str]:
    """The repair the drain's evidence calls for, and why."""
    best: tuple[Plan, str] | None = None
    for alertname, xid in drained.alerts:
        found: tuple[Plan, str] | None = None
        if alertname in XID_ALERTS and xid is not None:
            if xid in RESET_XIDS:
                found = ("reset_gpu", f"XID {xid}: the catalog's action is a GPU reset")
            elif xid in REBOOT_XIDS:
                found = ("reboot", f"XID {xid}: the catalog's action is a reboot")
            else:
                found = ("replace", f"XID {xid}: no automatic repair mends it (the catalog's)")
        elif alertname in BY_ALERT:
            found = (BY_ALERT[alertname], f"{alertname}")
        if found and (best is None or STRENGTH[found[0]] > STRENGTH[best[0]]):
            best = found
    if best is not None:
        return best
    plan = BY_CAUSE.get(drained.cause, "replace")
    return plan, f"drained for {drained.cause}"


def begin(
    drained: Drained, seq: int, earlier: list[Repair], policy: Policy, now: datetime
) -> tuple[Repair, Move | None]:
    """The node's `seq`-th repair, of a drain just seen, and its first move when it goes
    straight to a person: its fault has no automatic repair, it failed again after an earlier
    repair within the repeat window, or its repair budget (the resets and reboots that ran in
    the window) is spent."""
    plan, why = plan_for(drained)
    repair = Repair(drained.node, seq, drained, plan, why, started=now, since=now)
    window = policy.repeats.window
    recent = [r for r in earlier if now - r.started <= window]
    repaired = [r for r in recent if (s := r.last("resume")) is not None and s.state == EXECUTED]
    tried = [r for r in recent if r.tried]
    if plan == "replace":
        return repair, _replace(repair, now, policy, f"{why}: replace or service it")
    if plan == "reboot" and not policy.repairs.reboot:
        return repair, _replace(
            repair, now, policy, f"{why}; slurmedic does not reboot here (repairs.reboot: false): "
            "reboot it, or service it",
        )  # fmt: skip
    if repaired:
        return repair, _replace(
            repair,
            now,
            policy,
            f"failed again after its repair {repaired[-1].key} (within "
            f"{_days(window)}): replace it, not another {plan.replace('_', ' ')}",
        )
    budget = policy.repairs.budget
    if len(tried) >= budget:
        return repair, _replace(
            repair,
            now,
            policy,
            f"its repair budget is spent ({len(tried)} repairs within {_days(window)}): "
            "replace or service it",
        )
    return repair, None


def advance(
    repair: Repair, node: Node | None, policy: Policy, now: datetime, in_repair: int
) -> Move | None:
    """The repair's next move on the cluster as Slurm shows it now, or None while it waits.
    `in_repair`: the nodes in repair now (this one aside)."""
    if repair.state in CLOSED:
        return None
    if node is None:
        return Move(ENDED, f"{repair.node} is no longer a node of the cluster")
    refused = next((s for s in repair.steps if s.state in REFUSED), None)
    if refused is not None:
        return Move(ENDED, f"{refused.action} (decision {refused.id}) was {refused.state}")
    if not repair.dry_run and (why := _taken_over(repair, node, now)):
        return Move(ENDED, why)
    if repair.state == WAITING:
        return _start(repair, node, policy, now, in_repair)
    if repair.state == REPAIRING:
        return _repaired(repair, node, policy, now)
    if repair.state == CHECKING:
        return _checked(repair, policy, now)
    if repair.state == RESUMING:
        step = repair.last("resume")
        if step is None or not _done(step, repair.dry_run):
            return _failed(repair, step, policy, now)
        return Move(PROBATION, f"{repair.node} is back in service: its next failure within "
                    f"{_days(policy.repeats.window)} sends it to replacement")  # fmt: skip
    if repair.state == PROBATION and repair.since and now - repair.since >= policy.repeats.window:
        return Move(DONE, f"{repair.node} served {_days(policy.repeats.window)} since its repair")
    return None


def failed_on_probation(repair: Repair) -> Move:
    """A node on probation drained again: it goes to replacement (the new drain's repair says
    so to a person: `begin`)."""
    return Move(REPLACE, f"{repair.node} failed again within its probation")


def covers(current: Repair, drained: Drained, policy: Policy) -> bool:
    """Whether the node's current repair covers a new drain of it: it is under way, or it only
    dry-ran and the drain comes less than `repeats.apart` after its own (monitor mode's chain
    ends in seconds; the same fault's second alert, XID 79 then the GPU missing, is no failure
    on probation, as failures.distinct judges a node's drains)."""
    if current.state in UNDER_WAY:
        return True
    return (
        current.state == PROBATION
        and current.dry_run
        and drained.at - current.drained.at < policy.repeats.apart
    )


def folded(drained: Drained, seq: int, into: Repair, now: datetime) -> tuple[Repair, Move]:
    """A drain of a node whose repair is under way (its fault alerting again, a second
    incident on it): recorded as the node's `seq`-th repair, ended at once, as `into`
    covers it."""
    repair = Repair(drained.node, seq, drained, into.plan, into.why, started=now, since=now)
    return repair, Move(
        ENDED, f"drain {drained.drain} of {drained.node}: repaired under {into.key}"
    )


def _start(
    repair: Repair, node: Node, policy: Policy, now: datetime, in_repair: int
) -> Move | None:
    if not repair.dry_run and node.status not in ("drained", "drained*", "down", "down*"):
        return None  # a job still runs there (draining), or Slurm has not drained it yet
    cap = policy.repairs.max_in_repair
    if in_repair >= cap:
        return None  # the cap on nodes in repair: it waits its turn
    first = repair.plan  # begin sent a plan of `replace` to a person already
    state = CHECKING if first == "health_check" else REPAIRING
    what = {
        "reset_gpu": "reset its GPUs",
        "reboot": "reboot it (it comes back out of service)",
        "health_check": "check it",
    }[first]
    return Move(state, f"{repair.why}: {what}", _step(repair, first, now, policy))


def _repaired(repair: Repair, node: Node, policy: Policy, now: datetime) -> Move | None:
    action = repair.plan
    step = repair.last(action)
    if step is None:
        return None
    if step.state == FAILED:
        return _failed(repair, step, policy, now)
    if not _done(step, repair.dry_run):
        return None
    if action == "reboot" and not repair.dry_run:
        done_at = step.done_at or step.at
        if not _came_back(repair, node):
            if now - done_at > policy.repairs.reboot_timeout:
                return _replace(
                    repair,
                    now,
                    policy,
                    f"{repair.node} did not come back within "
                    f"{_minutes(policy.repairs.reboot_timeout)} of its reboot: service it",
                )
            return None
    return Move(
        CHECKING,
        f"{action.replace('_', ' ')} done: check it",
        _step(repair, "health_check", now, policy),
    )


def _checked(repair: Repair, policy: Policy, now: datetime) -> Move | None:
    step = repair.last("health_check")
    if step is None:
        return None
    if step.state == FAILED:
        return _failed(repair, step, policy, now)
    if not _done(step, repair.dry_run):
        return None
    if repair.dry_run or step.passed:
        return Move(
            RESUMING,
            "its health check passed: back to service" if step.passed else "then resume it",
            _step(repair, "resume", now, policy),
        )
    return _replace(
        repair, now, policy, f"its health check failed after the {repair.plan.replace('_', ' ')}"
        f": replace or service it{': ' + step.detail if step.detail else ''}"
    )  # fmt: skip


def _failed(repair: Repair, step: Step | None, policy: Policy, now: datetime) -> Move | None:
    if step is None or step.state in OPEN or step.state == RUNNING:
        return None
    why = f": {step.detail}" if step.detail else ""
    return _replace(repair, now, policy, f"its {step.action.replace('_', ' ')} failed{why}")


def _done(step: Step, dry_run: bool) -> bool:
    """The step ran; in a dry run, its dry run is recorded (the next step's follows it)."""
    return step.state == EXECUTED or (
        dry_run and step.state == RECORDED and step.done_at is not None
    )


def _came_back(repair: Repair, node: Node) -> bool:
    """The node registered again after its reboot: Slurm no longer holds the reboot, it answers,
    and it shows the reboot's reason (a node rebooted with nextstate=DOWN comes back down,
    `slurmedic: repair:gpu02 reboot : reboot issued : reboot complete`): a view read before
    the reboot was asked for shows the drain's."""
    return (
        not node.rebooting
        and not node.status.endswith("*")
        and node.reason.startswith(f"{REASON}{repair.key} ")
    )


def _taken_over(repair: Repair, node: Node, now: datetime) -> str | None:
    """Why the node is no longer slurmedic's to repair: a person resumed it, or drained or
    downed it with a reason of their own. Not while slurmedic's own resume returns it, and not
    before the view can show the drain (it lags by a refresh)."""
    if repair.state in (RESUMING, PROBATION) or node.reason.startswith(REASON):
        return None
    if node.in_service:
        if now - repair.drained.at < VIEW_LAG:
            return None
        if (reboot := repair.last("reboot")) is not None and reboot.state == EXECUTED:
            return (
                f"{repair.node} came back in service as it registered after its reboot, before "
                "its health check: Slurm's ReturnToService=2 returns a rebooted node whatever "
                "nextstate says (docs/repairs.md)"
            )
        return f"{repair.node} was returned to service by someone else"
    return f"{repair.node} is out of service for a reason not slurmedic's ({node.reason!r})"


def _decision(
    repair: Repair, action: str, now: datetime, reason: str, guard: str | None = None
) -> Decision:
    """A decision of the repair, about its node, citing the drain it repairs."""
    return Decision(
        at=now,
        incident=repair.key,
        job=None,
        action=action,
        cause=repair.drained.cause,
        reason=f"{repair.node}: {reason}",
        nodes=(repair.node,),
        evidence=({"drain": repair.drained.drain, "incident": repair.drained.incident},),
        guard=guard,
    )


def _step(repair: Repair, action: str, now: datetime, policy: Policy) -> Decision:
    reason = f"{action.replace('_', ' ')} ({repair.why})"
    d = with_mode(_decision(repair, action, now, reason), policy, repair.drained.partition)
    if repair.dry_run and d.mode != "monitor":
        # Its drain did not run: nothing of its repair may run either.
        d = replace(d, mode="monitor", state=RECORDED, guard="drain_not_run")
    return d


def _replace(repair: Repair, now: datetime, policy: Policy, why: str) -> Move:
    d = _decision(repair, "escalate", now, why, REPLACE_GUARD)
    return Move(REPLACE, why, with_mode(d, policy, repair.drained.partition))


def _days(d: timedelta) -> str:
    days = d.total_seconds() / 86400
    return f"{days:g}d" if days >= 1 else _minutes(d)


def _minutes(d: timedelta) -> str:
    return f"{d.total_seconds() / 60:g}m"
