"""The lab's Prometheus loads every rule file of the repo (lab profile) and evaluates each rule
without error: a rule file added to alert_rules/templates/ needs no change to the lab."""

from typing import Any

import pytest
import requests
import yaml

from lab.config import LabConfig
from tests.lab.conftest import eventually
from webhook.rules.render import RuleSource

pytestmark = pytest.mark.lab


def loaded_rules(cfg: LabConfig) -> dict[str, dict[str, Any]]:
    """Rule name (record or alert) to its state in Prometheus' rules API."""
    body = requests.get(f"{cfg.prometheus_url}/api/v1/rules", timeout=5).json()
    return {r["name"]: r for g in body["data"]["groups"] for r in g["rules"]}


def test_every_rule_is_loaded_and_evaluates(lab_cfg: LabConfig) -> None:
    names = {
        rule.get("record") or rule["alert"]
        for text in RuleSource().render("lab").values()
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
    }
    assert {"slurmedic:cluster_ettr:ratio", "SlurmedicDown"} <= names

    def all_ok() -> bool:
        rules = loaded_rules(lab_cfg)
        wrong = {n: "missing" for n in names - set(rules)}
        wrong |= {
            n: rules[n].get("lastError") or rules[n]["health"]
            for n in names & set(rules)
            if rules[n]["health"] != "ok"
        }
        if wrong:
            raise AssertionError(wrong)  # eventually() reports the last one
        return True

    eventually(all_ok, what="every rule loaded and evaluated")
