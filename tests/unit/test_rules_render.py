"""Rule files are rendered from templates + config.yml; the committed ones must match."""

import shutil
from pathlib import Path

import pytest
import yaml

from webhook.rules.render import RULES_DIR, RulesError, RuleSource, seconds


def test_committed_rule_files_match_a_fresh_render() -> None:
    assert RuleSource().stale() == []


def test_every_alert_carries_the_contract() -> None:
    """DESIGN.md's alert contract: severity, signal, summary/description/runbook_url."""
    signals = {
        "gpu_hw",
        "gpu_app",
        "node_down",
        "network",
        "nccl_timeout",
        "app_error",
        "hang",
        "straggler",
    }
    alerts = []
    for text in RuleSource().render().values():
        for group in yaml.safe_load(text)["groups"]:
            alerts += [r for r in group["rules"] if "alert" in r]
    assert len(alerts) >= 19
    for rule in alerts:
        name = rule["alert"]
        assert name[0].isupper() and "_" not in name, name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert rule["labels"]["signal"] in signals, name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert rule["annotations"]["runbook_url"].endswith(f"/docs/runbooks/{name}.md")
        assert (RULES_DIR.parent / "docs" / "runbooks" / f"{name}.md").exists(), name


def test_the_lab_profile_shortens_durations() -> None:
    hang = "label_replace(training_attempt_start_timestamp_seconds"
    lab = RuleSource().render("lab")["training.rules.yml"]
    prod = RuleSource().render()["training.rules.yml"]
    assert hang in lab and ") > 12\n" in lab
    assert hang in prod and ") > 600\n" in prod


def test_an_edit_of_config_is_a_stale_render(tmp_path: Path) -> None:
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    config = copy / "config.yml"
    config.write_text(config.read_text().replace("hang_after: 10m", "hang_after: 20m"))
    assert RuleSource(copy).stale() == ["training.rules.yml"]
    RuleSource(copy).write(copy)
    assert RuleSource(copy).stale() == []
    assert "> 1200" in (copy / "training.rules.yml").read_text()


def test_unknown_profile_and_keys_are_named(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match=r"profile: .prod. is not in config\.yml"):
        RuleSource().render("prod")
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    config = copy / "config.yml"
    config.write_text(config.read_text().replace("    hang_after: 12s", "    hang_aftr: 12s"))
    with pytest.raises(RulesError, match=r"profiles\.lab: unknown key .hang_aftr."):
        RuleSource(copy).render("lab")


@pytest.mark.parametrize(("d", "s"), [("10m", 600), ("1h", 3600), ("12s", 12), ("2d", 172800)])
def test_seconds(d: str, s: int) -> None:
    assert seconds(d) == s


def test_bad_duration() -> None:
    with pytest.raises(RulesError, match="not a duration"):
        seconds("ten minutes")
