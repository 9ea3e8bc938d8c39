"""Each alert's own delay: its rule's `for:`, read from the rule files as rendered.

An alert reaches Alertmanager (and slurmedic) with `startsAt` when it began to fire, after its
rule's `for:` held: the fault's first evidence (the metric's change) came that long before. The
trial report measures fault to recommendation from there, and shows the rules' share apart.
"""

from __future__ import annotations

import functools

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
    """The shipped rules' delays, rendered once a process (the console's report page)."""
    return rule_delays(RuleSource())
