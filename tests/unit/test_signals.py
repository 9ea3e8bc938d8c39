"""The `signal` vocabulary has one home (webhook/core/signals.py): the rule files use only its
values, Alertmanager routes any signal to slurmedic without listing them, and no other module
of the service spells a set of them. So a new alert with an existing signal (say an InfiniBand
link-down alert with `signal: network`) is a rule, its promtool test and its runbook - nothing in
the core."""

from __future__ import annotations

import ast
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core import signals
from webhook.core.alerts import Alert
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.decisions import DRAIN_CAUSES
from webhook.core.drills import CAUSE as DRILL
from webhook.core.drills import FAILED_GUARD as DRILL_FAILED
from webhook.core.evidence import from_alert
from webhook.core.notices import Open, as_alert, notices
from webhook.core.signals import SIGNALS, VOCABULARY, Kind
from webhook.rules.render import RULES_DIR, RuleSource

PACKAGE = Path(signals.__file__).resolve().parents[1]
ALERTMANAGER = RULES_DIR / "alertmanager.yml"


def _rule_signals(rendered: dict[str, str]) -> dict[str, str]:
    return {
        r["alert"]: r["labels"]["signal"]
        for text in rendered.values()
        for g in yaml.safe_load(text)["groups"]
        for r in g["rules"]
        if "alert" in r and "signal" in r.get("labels", {})
    }


def test_every_rule_file_rendering_uses_only_vocabulary_signals() -> None:
    profiles = yaml.safe_load((RULES_DIR / "config.yml").read_text())["profiles"]
    source = RuleSource()
    renderings = [source.render(), *(source.render(p) for p in profiles)]
    for rendered in renderings:
        assert _rule_signals(rendered), "no alert carries a signal"
    # The variants beside the tests hold only the files a profile changes (the shard's has no
    # alert at all).
    for rendered in renderings + list(source.variants().values()):
        used = _rule_signals(rendered)
        assert set(used.values()) <= SIGNALS, {a: s for a, s in used.items() if s not in SIGNALS}


def test_every_signal_is_named_once_and_hardware_names_a_drain_cause() -> None:
    names = [s.name for s in VOCABULARY]
    assert len(names) == len(set(names))
    for s in VOCABULARY:
        assert bool(s.cause) == (s.kind in (Kind.HARDWARE, Kind.DEGRADED)), s.name
    # Hardware evidence names a cause slurmedic drains for.
    assert set(signals.HARDWARE.values()) <= DRAIN_CAUSES


def _matchers(route: dict[str, Any]) -> list[str]:
    found = [str(m) for m in route.get("matchers") or []]
    for child in route.get("routes") or []:
        found += _matchers(child)
    return found


def test_alertmanager_routes_name_no_signal() -> None:
    config = yaml.safe_load(ALERTMANAGER.read_text())
    matchers = _matchers(config["route"])
    for rule in config.get("inhibit_rules", []):
        matchers += rule.get("source_matchers", []) + rule.get("target_matchers", [])
    assert any(m.startswith("signal") for m in matchers)
    for m in matchers:
        value = m.split("=", 1)[-1].lstrip("~")
        assert not {w.strip('"^$()') for w in value.split("|")} & SIGNALS, m


def _receivers(*labels: str) -> list[str]:
    amtool = shutil.which("amtool")
    assert amtool, "amtool is not on PATH (Debian package prometheus-alertmanager)"
    out = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip().split(",")


@pytest.mark.parametrize("signal", sorted(SIGNALS))
def test_alertmanager_sends_every_vocabulary_signal_to_slurmedic(signal: str) -> None:
    assert "slurmedic" in _receivers("alertname=AnyNewAlert", f"signal={signal}", "node=gpu01")


def test_alertmanager_keeps_alerts_without_a_signal_from_slurmedic() -> None:
    assert "slurmedic" not in _receivers("alertname=SlurmedicDown", "severity=critical")
    assert "slurmedic" not in _receivers("alertname=SlurmManyNodesDown", "signal=")
    # A warning to people about a job: one notification per job, never to slurmedic.
    stale = ("alertname=TrainingCheckpointStale", "severity=warning", "slurm_job_id=1100")
    assert _receivers(*stale) == ["oncall"]


def _notice(action: str, cause: str, *, state: str = "executed", **kw: Any) -> list[str]:
    """The labels of the notice slurmedic posts for such a decision of job 7, owned by alice
    (account vision, partition train) unless `job` says otherwise, as amtool takes them."""
    at = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
    job = kw.pop(
        "job", Job(id=7, nodes=("gpu01",), partition="train", user="alice", account="vision")
    )
    row = Open(4, "7.0", 7, action, cause, kw.pop("guard", None), state, "why", at, **kw)
    (n,) = notices([row], at, {7: job} if job else {})
    return [f"{k}={v}" for k, v in as_alert(n, at, timedelta(minutes=1), "")["labels"].items()]


@pytest.mark.parametrize(
    ("what", "labels", "receiver"),
    [
        ("an application escalation", _notice("escalate", "application"), "job-owners"),
        ("a failed drill", _notice("escalate", DRILL, guard=DRILL_FAILED), "job-owners"),
        (
            "a failed recovery of an application crash",
            _notice("escalate", "application", guard="recovery_failed"),
            "job-owners",
        ),
        ("a stop", _notice("stop", "application"), "job-owners"),
        ("a hardware escalation", _notice("escalate", "gpu_hardware"), "oncall"),
        (
            "a failed recovery of a hardware fault",
            _notice("escalate", "node_failure", guard="recovery_failed"),
            "oncall",
        ),
        ("a shared cause", _notice("escalate", "shared_infrastructure"), "oncall"),
        ("a hang", _notice("escalate", "hang"), "oncall"),
        ("an approval", _notice("stop", "application", state="awaiting_approval"), "oncall"),
        ("a mismatch", _notice("requeue", "application", mismatch="x2"), "oncall"),
        # Nobody known to tell: the operators.
        (
            "an unowned application escalation",
            _notice("escalate", "application", job=None),
            "oncall",
        ),
        ("an unowned stop", _notice("stop", "application", job=None), "oncall"),
    ],
)
def test_alertmanager_sends_a_job_s_own_failures_to_its_owner_and_the_rest_to_operators(
    what: str, labels: list[str], receiver: str
) -> None:
    assert ("slurm_user=alice" in labels) != ("unowned" in what)
    assert _receivers(*labels) == [receiver], what


def test_an_alert_for_people_that_reaches_slurmedic_anyway_is_recorded_not_acted_on() -> None:
    """A site that routes every alert to the webhook: TrainingCheckpointStale, as rendered, is
    evidence with a problem ("no signal"), never a reason to act on its job."""
    text = RuleSource().render()["goodput.rules.yml"]
    rule = next(
        r
        for g in yaml.safe_load(text)["groups"]
        for r in g["rules"]
        if r.get("alert") == "TrainingCheckpointStale"
    )
    assert "signal" not in rule["labels"]
    now = datetime(2026, 1, 1, tzinfo=UTC)
    view = ClusterView(nodes={"gpu01": Node("gpu01", "gpu")})
    labels = {"alertname": "TrainingCheckpointStale", "slurm_job_id": "1100", **rule["labels"]}
    alert = Alert(status="firing", startsAt=now, labels=labels, fingerprint="f0")
    ev = from_alert(alert, now, view)
    assert not ev.actionable and ev.problems == ("no signal",)
    assert ev.job == 1100


def test_a_signal_outside_the_vocabulary_is_recorded_not_acted_on() -> None:
    """What the open route relies on: slurmedic, not Alertmanager, keeps the vocabulary."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    view = ClusterView(nodes={"gpu01": Node("gpu01", "gpu")})
    labels = {"alertname": "X", "node": "gpu01", "signal": "infiniband"}
    alert = Alert(status="firing", startsAt=now, labels=labels, fingerprint="f0")
    ev = from_alert(alert, now, view)
    assert not ev.actionable and "not in the vocabulary" in ev.problems[0]
    for signal in sorted(SIGNALS):
        labels = {"alertname": "X", "node": "gpu01", "signal": signal}
        alert = Alert(status="firing", startsAt=now, labels=labels, fingerprint="f0")
        assert from_alert(alert, now, view).actionable, signal


def _signal_literal_sets(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Set | ast.Tuple | ast.List | ast.Dict):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            words = {
                i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)
            }
            # Causes share some names with signals (`hang`, `network`): a set of causes is not one
            # of signals unless every word in it is a signal.
            if len(words) >= 2 and words <= SIGNALS:
                lines.append(node.lineno)
    return lines


def test_no_module_but_signals_py_lists_signals() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "signals.py" and path.parent.name == "core":
            continue
        found = _signal_literal_sets(ast.parse(path.read_text(), str(path)))
        if found:
            offenders[str(path.relative_to(PACKAGE))] = found
    assert offenders == {}
    # The check itself sees a list where there is one.
    assert _signal_literal_sets(ast.parse('X = ("gpu_hw", "hang")')) == [1]
    assert _signal_literal_sets(ast.parse('X = {"gpu_hardware", "network", "straggler"}')) == []
