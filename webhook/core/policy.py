"""The policy: modes, scope, retry budget, circuit breaker, shared-cause thresholds.

One YAML file, validated with errors that name the bad key. Defaults are in
docs/operations.md; a file (or a scenario's `policy:`) overrides only the keys it gives.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from webhook.core import durations
from webhook.core.node_names import NodeNames
from webhook.core.patterns import check_argv
from webhook.core.validation import describe

Mode = Literal["monitor", "approve", "enforce"]
Action = Literal[
    "drain", "requeue", "stop", "escalate", "resume", "none", "reset_gpu", "reboot", "health_check"
]
# The cause vocabulary (docs/operations.md); the signals point to the hardware ones (signals.py).
Cause = Literal[
    "gpu_hardware",
    "node_failure",
    "network",
    "degraded",
    "shared_infrastructure",
    "application",
    "hang",
    "straggler",
    "unknown",
    "drill",
]
# Rule 5's cause: never drained, and a job is never stopped for it.
SHARED: Cause = "shared_infrastructure"
# Failures per 1,000 node-days of a large training fleet: Llama 3 405B's (419 in 54 days on
# 2,048 nodes), the published figure for the jobs slurmedic is for.
FAILURE_RATE = 3.8
MODES: tuple[str, ...] = get_args(Mode)
ACTIONS: tuple[str, ...] = get_args(Action)
CAUSES: tuple[str, ...] = get_args(Cause)


def _duration(value: Any) -> timedelta:
    """A Prometheus duration (`90s`, `1h30m`), or a number of seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return timedelta(seconds=value)
    return durations.parse(str(value))


# Written back (`policy check`, the JSON of a dump) as it is typed: `11m`, which reads back.
Duration = Annotated[
    timedelta, BeforeValidator(_duration), PlainSerializer(durations.exact, when_used="json")
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Scope(_Strict):
    partitions: list[str] = []
    require_opt_in: bool = False
    # Exit codes with which a job asks not to be restarted: NVIDIA's Resiliency Extension
    # (NVRx) ends a workload that makes no progress with 93.
    no_restart_exit_codes: list[Annotated[int, Field(ge=0, le=255)]] = [93]


class Drills(_Strict):
    # Only jobs whose comment says {"slurmedic": {"drill": true}} are drilled.
    require_opt_in: bool = False


class RetryBudget(_Strict):
    """Two budgets per job in `window`, counted apart (decisions.removes):

    - the requeues that take nothing away from the job (its crash with retry_application, a
      hang, a failure nobody is blamed for, a failed recovery): the same failure again with
      nothing removed is a crash loop, stopped after `max_requeues`;
    - the requeues that take the failure's nodes out of its reach (nodes slurmedic blames and
      drains, a failing switch's): they cannot loop, and a job of thousands of nodes meets
      such a failure every few hours. Bounded by what the job's size explains: `hardware_
      headroom` times the failures its nodes expect in the window at the policy's
      `failure_rate` (rounded down), never fewer than `max_requeues`; or a fixed
      `max_hardware_requeues`. Past it the job meets failures far more often than independent
      faults would give it (a job that breaks or trips what it runs on): stopped for a person.
    """

    max_requeues: int = Field(default=3, ge=0)
    window: Duration = timedelta(hours=24)
    hardware_headroom: float = Field(default=3.0, ge=0)
    # A number: that budget for the requeues that remove nodes, whatever the job's size,
    # instead of the one its size gives. (Before the budgets were always apart, it was the
    # opt-in that counted them apart; unset then meant one budget for every requeue.)
    max_hardware_requeues: int | None = Field(default=None, ge=0)


class Breaker(_Strict):
    max_fraction: float = Field(default=0.10, gt=0, le=1)
    window: Duration = timedelta(hours=1)


class SharedCause(_Strict):
    window: Duration = timedelta(minutes=5)
    switch_fraction: float = Field(default=0.5, gt=0, le=1)
    switch_min_nodes: int = Field(default=3, ge=1)
    cluster_fraction: float = Field(default=0.2, gt=0, le=1)
    cluster_min_nodes: int = Field(default=4, ge=1)
    # Bursts: node failures across leaf switches (whatever jobs held them) within the window
    # that independent failures would produce less often than once in 1 / burst_chance windows,
    # at the policy's `failure_rate`. With 2,048 nodes: 4 within 5m; with 16,384: 6; never
    # fewer than burst_min_nodes.
    burst_chance: float = Field(default=1e-6, gt=0, lt=1)
    burst_min_nodes: int = Field(default=3, ge=2)
    # A node that stopped answering or lost its fabric port is drained no sooner than this after
    # its alert started: Slurm notices a blip's nodes over a ping cycle (MessageTimeout, 10 s by
    # default), the rules over a scrape, and the first of them alone is no burst yet. A GPU's own
    # fault is not held. 0: no hold.
    burst_wait: Duration = timedelta(seconds=60)
    # A job that has failed of a switch's fault (it ended by a fault, a rank logged a fatal
    # error, or its progress stalled) is requeued at once, off every node of the failing
    # switch, none of them drained; the switch still goes to a person. Off: the job waits for
    # that person too. Never for a job that still runs (many nodes "down" at once may be the
    # monitoring's fault: rule 5 escalates it), for a cluster-wide cause or a
    # burst (there is no healthy side), past the job's retry budget (then it waits: a job is
    # never stopped for a shared cause), or when its partition has too few other nodes to run
    # it. On by default since issue 36: a job that died of a leaf switch loses nothing by
    # moving off it, and waiting for the person costs its whole allocation by the hour (in the
    # simulator, about a point of ETTR on Llama 3's trace).
    requeue_away: bool = True
    # A job that fails within this long of the storm's last failure died of it (its ranks wait
    # out PyTorch's 10-minute NCCL timeout, then the job ends); one that fails later failed of
    # something else, and is not moved off a switch mended since.
    requeue_away_within: Duration = timedelta(minutes=20)
    # How long a job requeued off a switch keeps its nodes excluded (Slurm keeps a job's
    # exclusion for good): a later requeue of the job readmits those in service. A switch
    # still down then costs the job one more failure, and it is moved off again.
    requeue_away_for: Duration = timedelta(hours=24)


class Repeats(_Strict):
    # A node drained for its own fault this many times within the window (the last one
    # included) is a hardware suspect: drained with the repeat in its reason and escalated for
    # replacement, not cycled through drain and resume. The same count of application-class
    # XIDs on one GPU under different jobs points at the GPU, not at the code.
    window: Duration = timedelta(days=7)
    count: int = Field(default=2, ge=2)
    # Failures of one node less than this apart are one failure (its second alert, XID 79 then
    # the GPU missing): a node mended and back in service takes longer.
    apart: Duration = timedelta(hours=1)


class Slowdown(_Strict):
    # A slow job (a straggler, a throttled GPU, a degraded node's slow rank) that still trains is
    # requeued only when its slow steps until the next checkpoint lose more than the work a
    # restart now would redo; else after that checkpoint (webhook.core.slowdown). Needs the
    # checkpoint's figures on the alert (the shipped rules' annotations from the progress
    # reports); without them the requeue goes ahead. Off: requeue at once, as before.
    weigh_checkpoint: bool = True
    # How long after the next checkpoint is due the requeue waits (for it to be written).
    checkpoint_margin: Duration = timedelta(minutes=2)


class Repairs(_Strict):
    """The repair of nodes slurmedic drained (webhook.core.repairs): a GPU reset or a reboot, the
    health check, then back to service. Each step takes the mode of its action (`reset_gpu`,
    `reboot`, `health_check`, `resume`) like every action."""

    enabled: bool = True
    # At most this many repairs of one node within repeats.window: past it the node goes to a
    # person for replacement (no reset or reboot loops).
    budget: int = Field(default=2, ge=1)
    # Nodes in repair at once (reset, reboot, check, resume under way); the rest wait their turn.
    max_in_repair: int = Field(default=8, ge=1)
    # A rebooted node that has not registered again by then goes to a person.
    reboot_timeout: Duration = timedelta(minutes=30)
    # Whether Slurm reboots nodes here (`scontrol reboot`, its RebootProgram). False where a
    # reboot is no Slurm event (Slinky on Kubernetes: a pod's or a Kubernetes node's): what a
    # reboot would mend goes to a person instead.
    reboot: bool = True
    # The site's health check, run on the node after its repair (exit 0: healthy): DCGM's
    # medium diagnostics by default; NHC or any command. An inventory host var
    # `slurmedic_health_check` overrides it per node.
    health_check: list[str] = Field(
        default=["dcgmi", "diag", "-r", "2"], min_length=1, max_length=32
    )
    # How long the health check may run.
    health_check_timeout: Duration = timedelta(minutes=30)

    @field_validator("health_check")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        return check_argv(argv)  # what the health check playbook's own check takes


QualityBetter = Literal["lower", "higher"]


class Verify(_Strict):
    # A requeued job must pass the step it failed at within this time (restart, resume from
    # the checkpoint, catch up) or its recovery counts as failed.
    deadline: Duration = timedelta(minutes=30)  # counted from the successor's start
    # A successor still waiting to start after this long is left unverified.
    pending_limit: Duration = timedelta(hours=24)
    # Stop a job whose restarts keep failing before they write a first checkpoint.
    max_failures_before_checkpoint: int = Field(default=2, ge=1)
    # A successor's quality value (the loss its job reports) may be at most this fraction of
    # it worse than the failed attempt's last: worse still, its checkpoint was not sound.
    quality_tolerance: float = Field(default=0.25, gt=0)
    quality_better: QualityBetter = "lower"  # a loss; "higher" for an accuracy


class PartitionModes(_Strict):
    """A partition's own modes (staged enablement: a canary partition in enforce while the
    rest stay in monitor or approve), and its own retry budget (a partition of short jobs
    that retries freely, one of long ones that does not). Unset keys fall back to the
    policy's."""

    mode: Mode | None = None
    actions: dict[Action, Mode] = {}
    # An action's mode for one cause on this partition: the most specific of all.
    causes: dict[Cause, dict[Action, Mode]] = {}
    # The keys given override the policy's retry_budget for this partition's jobs.
    retry_budget: RetryBudget | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_breaker(cls, data: Any) -> Any:
        if isinstance(data, dict) and "breaker" in data:
            raise ValueError(
                "breaker: the breaker is the whole cluster's (it bounds the drains of every "
                "partition together, as a storm crosses them); set it at the top of the policy"
            )
        return data


class Policy(_Strict):
    mode: Mode = "monitor"
    actions: dict[Action, Mode] = {}
    # An action's mode for one cause (requeue enforced for gpu_hardware while degraded GPUs'
    # requeues stay in approve): before `actions`, after a partition's own keys.
    causes: dict[Cause, dict[Action, Mode]] = {}
    # Per partition, by name: its jobs' decisions (and drains of idle nodes that serve it
    # alone) take these modes first.
    partitions: dict[str, PartitionModes] = {}
    scope: Scope = Scope()
    settle_seconds: float = Field(default=20, ge=0)
    # The longest an incident that can only say "stalled" (a hang signal, NCCL timeouts, no node
    # named) waits for evidence that names a node, from when it opened: PyTorch's default
    # collective timeout (10 min) and a minute for the alert to get here. With hang_after close
    # to the collective timeout, (timeout - hang_after) plus a minute is enough.
    hang_wait: Duration = timedelta(minutes=11)
    # When the job has ended: how long, from when the incident opened (or the stall began,
    # when an alert dates it), it still waits for evidence that names a node. Its ranks are
    # gone, but not the node's own alerts (a fabric port down has `for: 1m`, a silent node
    # shows after a ping or two): NCCL reports a dead link in seconds, before them; those
    # alerts join the job's incident (node_alert_lag). Within hang_wait. 0: requeue at once,
    # blind (the next attempt can land on the dead link before its drain; docs/simulate.md
    # measures both).
    blame_wait: Duration = timedelta(minutes=2)
    # How late a node's hardware alert (no job label, or one for a job no longer there) may
    # start after a job on that node failed and still be news of that job's failure: a rule's
    # `for:` (1m for a fabric port), a scrape and an evaluation. Prometheus's startsAt is when
    # the alert fired, so a job that died at once (NCCL's transport error, a CUDA error) ends
    # before it. 0: such an alert is always a failure of the idle node.
    node_alert_lag: Duration = timedelta(minutes=2)
    retry_budget: RetryBudget = RetryBudget()
    # The cluster's base failure rate: failures that interrupt a job, per 1,000 node-days of
    # its nodes (published figures: Llama 3 405B's pretraining, 419 in 54 days on
    # 2,048 nodes, 3.8; Meta's research clusters 2.34 and 6.50). What a job of N nodes
    # expects in a window (`expected_failures`): the retry budget for requeues that remove
    # nodes scales with it, and a burst is judged against it (shared_cause).
    failure_rate: float = Field(default=FAILURE_RATE, ge=0)
    breaker: Breaker = Breaker()
    shared_cause: SharedCause = SharedCause()
    repeats: Repeats = Repeats()
    slowdown: Slowdown = Slowdown()
    verify: Verify = Verify()
    drills: Drills = Drills()
    repairs: Repairs = Repairs()
    # A decision waiting for approval longer than this expires (state `expired`): it was made on
    # a view of the cluster that has moved on, and a human approving it hours later would act on
    # that old view. The job's next failure is decided anew.
    approval_expires: Duration = timedelta(hours=4)
    # How long the engine remembers what it decided (incidents, their evidence, the alerts seen,
    # the guards' history) once nothing can change it. Unset: the longest window a decision
    # looks back over (`windows`); never shorter than one.
    retention: Duration | None = None
    # How alerts' host names become Slurm's node names (a domain stripped, rewrites).
    node_names: NodeNames = NodeNames()

    def windows(self) -> dict[str, timedelta]:
        """The windows decisions look back over, by key: what the engine must remember."""
        return {
            "settle_seconds": timedelta(seconds=self.settle_seconds),
            "hang_wait": self.hang_wait,
            "node_alert_lag": self.node_alert_lag,
            "shared_cause.window": self.shared_cause.window,
            "retry_budget.window": self.retry_budget.window,
            "breaker.window": self.breaker.window,
            **{
                f"partitions.{name}.retry_budget.window": p.retry_budget.window
                for name, p in self.partitions.items()
                if p.retry_budget is not None and "window" in p.retry_budget.model_fields_set
            },
        }

    def budget_for(self, partition: str | None) -> RetryBudget:
        """The retry budget of a job in `partition`: the policy's, with the keys its partition
        gives instead."""
        own = self.partitions.get(partition) if partition else None
        if own is None or own.retry_budget is None:
            return self.retry_budget
        return self.retry_budget.model_copy(update=own.retry_budget.model_dump(exclude_unset=True))

    def expected_failures(self, nodes: int, window: timedelta) -> float:
        """The failures a job on `nodes` nodes expects in `window` at `failure_rate`."""
        return nodes * self.failure_rate / 1000 * window.total_seconds() / 86400

    def hardware_requeues(self, nodes: int, rules: RetryBudget | None = None) -> int:
        """The retry budget (the policy's, or `rules`), in its window, for the requeues of a
        job on `nodes` nodes that take the failure's nodes out of its reach (RetryBudget)."""
        rules = rules or self.retry_budget
        if rules.max_hardware_requeues is not None:
            return rules.max_hardware_requeues
        expected = self.expected_failures(nodes, rules.window)
        # Rounded down; a product that is a whole number may come out a hair under it.
        return max(rules.max_requeues, math.floor(rules.hardware_headroom * expected + 1e-9))

    @property
    def retention_age(self) -> timedelta:
        return self.retention or max(self.windows().values())

    @model_validator(mode="after")
    def _retention_covers_the_windows(self) -> Policy:
        if self.retention is not None:
            key, window = max(self.windows().items(), key=lambda kv: kv[1])
            if self.retention < window:
                raise ValueError(
                    f"retention: {_seconds(self.retention)} is shorter than {key} "
                    f"({_seconds(window)}): what a decision still looks back at would be forgotten"
                )
        return self

    def in_scope(self, partition: str | None) -> bool:
        """Whether the policy's partitions take in `partition` (none given: every one)."""
        return not self.scope.partitions or partition in self.scope.partitions

    def mode_of(self, action: str, partition: str | None = None, cause: str | None = None) -> Mode:
        """The most specific mode: the partition's for the action and cause, for the action,
        the partition's; then the policy's for the action and cause, for the action, the
        policy's."""
        own = self.partitions.get(partition) if partition else None
        if own is not None:
            if (found := _for(own.causes, cause, action)) is not None:
                return found
            if action in own.actions:
                return own.actions[action]
            if own.mode is not None:
                return own.mode
        if (found := _for(self.causes, cause, action)) is not None:
            return found
        return self.actions.get(action, self.mode)  # type: ignore[call-overload, no-any-return]


def _for(causes: dict[Cause, dict[Action, Mode]], cause: str | None, action: str) -> Mode | None:
    """An action's mode for a cause, when `causes` names one."""
    by_action: dict[str, Mode] = dict(causes.get(cause, {})) if cause else {}  # type: ignore[call-overload]
    return by_action.get(action)


def _seconds(d: timedelta) -> str:
    return f"{int(d.total_seconds())}s"


class PolicyError(ValueError):
    """A policy that does not validate; the message names the key and why."""


def load_policy(data: dict[str, Any] | None, prefix: str = "") -> Policy:
    if data is not None and not isinstance(data, dict):
        raise PolicyError(f"{prefix or 'policy'}: must be a mapping")
    try:
        return Policy.model_validate(data or {})
    except ValidationError as e:
        raise PolicyError(describe(e, prefix)) from e
