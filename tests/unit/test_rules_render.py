"""Rule files are rendered from templates + config.yml; the committed ones must match."""

import shutil
from pathlib import Path

import pytest
import yaml

from webhook.rules.render import RULES_DIR, RulesError, RuleSource, seconds


def test_committed_rule_files_match_a_fresh_render() -> None:
    assert RuleSource().stale() == []


def test_every_alert_carries_the_contract() -> None:
    """DESIGN.md's alert contract: severity, signal, summary/description/runbook_url.

    Alerts about slurmedic itself (slurmedic.rules.yml) go to people, never to the engine: they
    carry no `signal`, so Alertmanager's slurmedic route cannot match them.
    """
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
    for file, text in RuleSource().render().items():
        for group in yaml.safe_load(text)["groups"]:
            alerts += [(file, r) for r in group["rules"] if "alert" in r]
    assert len(alerts) >= 25
    for file, rule in alerts:
        name = rule["alert"]
        assert name[0].isupper() and "_" not in name, name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        if file == "slurmedic.rules.yml":
            assert name.startswith("Slurmedic") and "signal" not in rule["labels"], name
        else:
            assert rule["labels"]["signal"] in signals, name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert rule["annotations"]["runbook_url"].endswith(f"/docs/runbooks/{name}.md")
        assert (RULES_DIR.parent / "docs" / "runbooks" / f"{name}.md").exists(), name


def _alerts_by_file() -> dict[str, list[str]]:
    return {
        file: [
            r["alert"] for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r
        ]
        for file, text in RuleSource().render().items()
    }


def test_every_alert_is_in_the_runbook_table() -> None:
    table = (RULES_DIR.parent / "docs" / "runbooks" / "README.md").read_text()
    for file, names in _alerts_by_file().items():
        for name in names:
            row = f"| [{name}]({name}.md) | {file.removesuffix('.rules.yml')} |"
            assert row in table, name


def test_every_rule_file_has_a_promtool_test_of_each_alert_firing_and_quiet() -> None:
    """DESIGN.md: every alert is tested with promtool, firing and staying silent."""
    for file, names in _alerts_by_file().items():
        test_file = RULES_DIR / "tests" / file.replace(".rules.yml", ".rules.test.yml")
        assert test_file.exists(), f"{file} has no {test_file.name}"
        suite = yaml.safe_load(test_file.read_text())
        assert suite["rule_files"] == [f"../{file}"], test_file.name
        cases = [c for t in suite["tests"] for c in t.get("alert_rule_test", [])]
        for name in names:
            mine = [c for c in cases if c["alertname"] == name]
            assert any(c.get("exp_alerts") for c in mine), f"{name} is never tested firing"
            assert any(not c.get("exp_alerts") for c in mine), f"{name} is never tested silent"


def test_every_recording_rule_of_the_goodput_file_is_checked_by_value() -> None:
    text = RuleSource().render()["goodput.rules.yml"]
    records = [r["record"] for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    suite = yaml.safe_load((RULES_DIR / "tests" / "goodput.rules.test.yml").read_text())
    checked = {c["expr"].split("{")[0] for t in suite["tests"] for c in t["promql_expr_test"]}
    assert set(records) <= checked, set(records) - checked


def test_the_lab_profile_shortens_durations() -> None:
    hang = "label_replace(training_attempt_start_timestamp_seconds"
    lab = RuleSource().render("lab")["training.rules.yml"]
    prod = RuleSource().render()["training.rules.yml"]
    assert hang in lab and ") < time() - 12\n" in lab
    assert hang in prod and ") < time() - 600\n" in prod


def test_the_lab_profile_shortens_goodput_and_self_monitoring() -> None:
    lab, prod = RuleSource().render("lab"), RuleSource().render()
    assert ") < bool 5\n" in lab["goodput.rules.yml"] and "[5m]" in lab["goodput.rules.yml"]
    assert ") < bool 120\n" in prod["goodput.rules.yml"] and "[1d]" in prod["goodput.rules.yml"]
    assert "for: 5s\n" in lab["slurmedic.rules.yml"] and "> 20\n" in lab["slurmedic.rules.yml"]
    assert "for: 5m\n" in prod["slurmedic.rules.yml"] and "> 120\n" in prod["slurmedic.rules.yml"]


def test_an_edit_of_config_is_a_stale_render(tmp_path: Path) -> None:
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    config = copy / "config.yml"
    config.write_text(config.read_text().replace("hang_after: 10m", "hang_after: 20m"))
    assert RuleSource(copy).stale() == ["training.rules.yml"]
    RuleSource(copy).write(copy)
    assert RuleSource(copy).stale() == []
    assert "time() - 1200" in (copy / "training.rules.yml").read_text()


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
