"""What a site's own files tell the simulator (the adapter at its edge): the rules' windows
and `for:` (alert_rules/config.yml, or the site's copy), Alertmanager's route to slurmedic
(its alertmanager.yml), and the simulated cluster (a YAML file of SimConfig's keys)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from webhook import resources
from webhook.core import durations
from webhook.core.validation import describe
from webhook.files import FileError, load_mapping
from webhook.rules.render import RulesError, RuleSource, seconds
from webhook.simulate.model import Delays, SimConfig


class SiteError(ValueError):
    """A file the simulator reads is wrong; the message names the file and the key."""


def sim_config(path: Path | None, **overrides: Any) -> SimConfig:
    """The simulated cluster: the defaults, a file's keys over them, then the command line's."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = load_mapping(path, "simulation file")
        except FileError as e:
            raise SiteError(str(e)) from e
    data |= {k: v for k, v in overrides.items() if v is not None}
    try:
        return SimConfig.model_validate(data)
    except ValidationError as e:
        raise SiteError(f"{path or 'simulate'}: {describe(e)}") from e


def delays(
    rules: RuleSource | None = None, alertmanager: Path | None = None, profile: str | None = None
) -> Delays:
    """The delays between a failure and its alert at the webhook that the site's rule config
    and Alertmanager route give (scrape and evaluation intervals stay Delays' defaults)."""
    try:
        values = (rules or RuleSource()).config(profile)
    except RulesError as e:
        raise SiteError(str(e)) from e
    out = replace(
        Delays(),
        hang_after=seconds(values["hang_after"]),
        ib_port_down_for=seconds(values["ib_port_down_for"]),
        node_down_for=seconds(values["node_down_for"]),
        window=seconds(values["joblog_window"]),
    )
    interval = _route_interval(alertmanager or resources.ALERTMANAGER_EXAMPLE)
    return replace(out, group_interval=interval) if interval is not None else out


def _route_interval(path: Path) -> float | None:
    """The slurmedic route's group_interval (group_wait is 0 there): how long an alert that
    joins a group waits for the group's next notification."""
    try:
        config = load_mapping(path, "Alertmanager config")
    except FileError as e:
        raise SiteError(str(e)) from e
    top = config.get("route") or {}
    for route in [top, *(top.get("routes") or [])]:
        if isinstance(route, dict) and route.get("receiver") == "slurmedic":
            value = route.get("group_interval", top.get("group_interval", "5m"))
            try:
                return durations.parse(str(value)).total_seconds()
            except durations.DurationError as e:
                raise SiteError(f"{path}: route group_interval: {e}") from e
    return None
