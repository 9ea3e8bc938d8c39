"""The rule config's keys, typed (alert_rules/config.yml): a value of the wrong kind is an
error naming the key, before any rule is rendered. `straggler_ratio: fast` would otherwise
render a rule that never fires, and promtool would call it valid.

The model checks: the templates get the values as written (`1` stays `1`, not `1.0`), so a
valid config renders exactly as before; only a duration given as a bare number of seconds (as
the policy takes them) is written with its unit (`300` → `300s`), which Prometheus needs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from webhook.core import durations
from webhook.core.validation import describe


def _seconds(value: Any) -> Any:
    # A bare number is seconds, as in the policy; Prometheus' rules need the unit.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"{value}s"
    return value


def _duration(value: str) -> str:
    durations.parse(value)  # DurationError (a ValueError) names what is wrong
    return value


Duration = Annotated[str, BeforeValidator(_seconds), AfterValidator(_duration)]
Positive = Annotated[float, Field(gt=0)]
Share = Annotated[float, Field(gt=0, le=1)]


class RuleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)

    runbook_base: str = Field(pattern=r"^https?://\S+$")
    rate_window: Duration
    # GPU (dcgm-exporter)
    xid_recent_window: Duration
    ecc_dbe_window: Duration
    remapped_rows_window: Duration
    nvlink_errors_per_second: Positive
    nvlink_for: Duration
    pcie_replays_per_second: Positive
    pcie_for: Duration
    throttle_fraction: Share
    throttle_for: Duration
    gpu_missing_lookback: Duration
    # Slurm
    node_status_metric: Literal["slurm_node_status", "slurmedic_node_status"]
    slurm_counts_source: Literal["exporter", "slurmctld"]
    slurmctld_selector: str = Field(min_length=1)
    node_down_lookback: Duration
    node_down_for: Duration
    many_nodes_down: int = Field(ge=1)
    many_nodes_down_window: Duration
    many_nodes_down_for: Duration
    node_fail_window: Duration
    # Node fabric
    ib_active_lookback: Duration
    ib_port_down_for: Duration
    # Job logs, training progress
    joblog_window: Duration
    hang_after: Duration
    straggler_ratio: float = Field(gt=1)
    straggler_for: Duration
    throughput_drop_ratio: float = Field(gt=0, lt=1)
    throughput_baseline: Duration
    throughput_for: Duration
    productive_window: Duration
    goodput_window: Duration
    checkpoint_interval_window: Duration
    checkpoint_stale_factor: float = Field(gt=1)
    checkpoint_stale_min: Duration
    checkpoint_stale_unknown: Duration
    # slurmedic itself
    slurmedic_job: str = Field(min_length=1)
    slurmedic_down_for: Duration
    loop_stalled_after: Duration
    executor_failures_window: Duration
    recoveries_failed_window: Duration
    recoveries_failed_min: int = Field(ge=1)
    monitor_switch_for: Duration
    # Where the rules are evaluated (render.LAYOUTS)
    rule_layout: Literal["single", "shard", "global"]
    slow_interval: Duration | Literal[""]
    shard_selector: str = Field(min_length=1)
    shard_down_for: Duration


def check(values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` as the templates take them (a duration given as a bare number of seconds gets
    its unit); ValueError naming `where` and the key when a value is not of its kind."""
    try:
        checked = RuleConfig.model_validate(values)
    except ValidationError as e:
        raise ValueError(f"{where}: {describe(e)}") from e
    # A number the model made a string is a duration given in seconds.
    return {
        k: (new if isinstance(v, int) and isinstance(new := getattr(checked, k, v), str) else v)
        for k, v in values.items()
    }
