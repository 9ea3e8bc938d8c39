"""Each alert's own delay: its rule's `for:`, read from the rule files as rendered.

An alert reaches Alertmanager (and slurmedic) with `startsAt` when it began to fire, after its
rule's `for:` held: the fault's first evidence (the metric's change) came that long before. The
trial report measures fault to recommendation from there, and shows the rules' share apart.
"""

from __future__ import annotations

import functools

from webhook.adapters.prometheus import Prometheus, PrometheusError
from webhook.core import durations
from webhook.files import parse_yaml
from webhook.rules.render import RuleSource


def rule_delays(source: RuleSource, profile: str | None = None) -> dict[str, float]:
    """Alert name to its rule's `for:` in seconds (0 without one), over every rendered file."""
    delays: dict[str, float] = {}
    for name, text in source.render(profile).items():
        for group in parse_yaml(text, name).get("groups") or []:
            for rule in group.get("rules") or []:
                if "alert" in rule:
                    held = durations.parse(str(rule["for"])) if rule.get("for") else None
                    delays[str(rule["alert"])] = held.total_seconds() if held else 0.0
    return delays


@functools.cache
def shipped_delays() -> dict[str, float]:
    """The shipped rules' delays, rendered once a process."""
    return rule_delays(RuleSource())


def delays_for(prometheus: Prometheus | None) -> tuple[dict[str, float], str]:
    """The rules' delays and where they were read: the rules Prometheus evaluates, when it
    answers (a site's own thresholds, the lab's profile), else the shipped rules'."""
    if prometheus is not None:
        try:
            return prometheus.rule_delays(), f"the rules Prometheus evaluates ({prometheus.url})"
        except PrometheusError as e:
            return shipped_delays(), f"the shipped rules (Prometheus did not answer: {e})"
    return shipped_delays(), "the shipped rules"
