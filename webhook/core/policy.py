"""The policy: modes, scope, retry budget, circuit breaker, shared-cause thresholds.

One YAML file, validated with errors that name the bad key. Defaults are DESIGN.md's; a file
(or a scenario's `policy:`) overrides only the keys it gives.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

Mode = Literal["monitor", "approve", "enforce"]
Action = Literal["drain", "requeue", "stop", "escalate", "resume", "none"]
_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return timedelta(seconds=value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration like 90s, 5m, 1h, 2d")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


Duration = Annotated[timedelta, BeforeValidator(_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Scope(_Strict):
    partitions: list[str] = []
    require_opt_in: bool = False


class RetryBudget(_Strict):
    max_requeues: int = Field(default=3, ge=0)
    window: Duration = timedelta(hours=24)


class Breaker(_Strict):
    max_fraction: float = Field(default=0.10, gt=0, le=1)
    window: Duration = timedelta(hours=1)


class SharedCause(_Strict):
    window: Duration = timedelta(minutes=5)
    switch_fraction: float = Field(default=0.5, gt=0, le=1)
    switch_min_nodes: int = Field(default=3, ge=1)
    cluster_fraction: float = Field(default=0.2, gt=0, le=1)
    cluster_min_nodes: int = Field(default=4, ge=1)


class Verify(_Strict):
    # A requeued job must pass the step it failed at within this time (restart, resume from
    # the checkpoint, catch up) or its recovery counts as failed.
    deadline: Duration = timedelta(minutes=30)  # counted from the successor's start
    # A successor still waiting to start after this long is left unverified.
    pending_limit: Duration = timedelta(hours=24)
    # Stop a job whose restarts keep failing before they write a first checkpoint.
    max_failures_before_checkpoint: int = Field(default=2, ge=1)


class Policy(_Strict):
    mode: Mode = "monitor"
    actions: dict[Action, Mode] = {}
    scope: Scope = Scope()
    settle_seconds: float = Field(default=20, ge=0)
    # The longest an incident that can only say "stalled" (a hang signal, NCCL timeouts, no node
    # named) waits for evidence that names a node, from when it opened: PyTorch's default
    # collective timeout (10 min) and a minute for the alert to get here. With hang_after close
    # to the collective timeout, (timeout - hang_after) plus a minute is enough.
    hang_wait: Duration = timedelta(minutes=11)
    retry_budget: RetryBudget = RetryBudget()
    breaker: Breaker = Breaker()
    shared_cause: SharedCause = SharedCause()
    verify: Verify = Verify()

    def mode_of(self, action: str) -> Mode:
        return self.actions.get(action, self.mode)  # type: ignore[call-overload, no-any-return]


class PolicyError(ValueError):
    """A policy that does not validate; the message names the key and why."""


def describe(err: ValidationError, prefix: str = "") -> str:
    """`key.sub: reason` for the first error of a pydantic validation."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{prefix}{loc}: {msg}" if loc else f"{prefix}{msg}"


def load_policy(data: dict[str, Any] | None, prefix: str = "") -> Policy:
    if data is not None and not isinstance(data, dict):
        raise PolicyError(f"{prefix or 'policy'}: must be a mapping")
    try:
        return Policy.model_validate(data or {})
    except ValidationError as e:
        raise PolicyError(describe(e, prefix)) from e
