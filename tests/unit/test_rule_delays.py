"""Each alert's `for:`, read from the rules as rendered with a config: what the trial report adds
to alert-to-recommendation times to measure them from the fault's first evidence."""

from __future__ import annotations

from webhook.rules.delays import rule_delays
from webhook.rules.render import RuleSource


def test_every_alert_has_its_rule_s_for_and_a_profile_changes_it() -> None:
    shipped = rule_delays(RuleSource())
    assert shipped["GpuNvlinkErrors"] == 300 and shipped["GpuPcieReplays"] == 600
    assert shipped["GpuXidNodeFault"] == 0  # no `for:`: it fires on the first evaluation
    assert rule_delays(RuleSource(), "lab")["GpuNvlinkErrors"] == 5
    # Every alert of every shipped file, recording rules aside.
    assert "TrainingHang" in shipped and not any(k.startswith("slurmedic:") for k in shipped)
