"""The core's boundary: real Alertmanager payloads, fingerprints, identity, policy, bad files."""

import ast
import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.core.alerts import Alert, Payload, fingerprint
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.evidence import from_alert, node_label
from webhook.core.policy import PolicyError, load_policy

REPO = Path(__file__).resolve().parents[2]
# Captured from Alertmanager 0.25 (shared/reference/alertmanager/), kept with the tests.
REAL = REPO / "tests" / "data" / "alertmanager"
REPO_SCENARIOS = REPO / "tests" / "scenarios"
T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("name", ["real-payload-firing.json", "real-payload-resolved.json"])
def test_real_payloads_validate_and_fingerprints_match_alertmanager(name: str) -> None:
    raw = json.loads((REAL / name).read_text())
    payload = Payload.model_validate(raw)
    for alert, original in zip(payload.alerts, raw["alerts"], strict=True):
        assert fingerprint(original["labels"]) == original["fingerprint"]
        assert alert.fingerprint == original["fingerprint"]


def test_missing_fingerprint_is_computed_like_alertmanager() -> None:
    a = Alert(status="firing", labels={"alertname": "X", "node": "gpu01"}, startsAt=T)
    b = Alert(status="firing", labels={"node": "gpu01", "alertname": "X"}, startsAt=T)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        ({"node": "gpu01", "hostname": "x"}, "gpu01"),
        ({"hostname": "gpu02", "Hostname": "y"}, "gpu02"),
        ({"Hostname": "gpu03"}, "gpu03"),
        ({"instance": "gpu04:9400"}, "gpu04"),
        ({}, None),
    ],
)
def test_node_identity_order(labels: dict[str, str], node: str | None) -> None:
    assert node_label(labels) == node


VIEW = ClusterView(
    nodes={"gpu01": Node("gpu01", "train")},
    jobs={7: Job(id=7, nodes=("gpu01",), partition="train")},
)


@pytest.mark.parametrize(
    "bad", ["gpu01; rm -rf /", "../etc/passwd", "gpu99", "$(reboot)", "gpu01\n", "-gpu01"]
)
def test_hostile_or_unknown_nodes_are_never_actionable(bad: str) -> None:
    alert = Alert(
        status="firing", startsAt=T, labels={"alertname": "X", "signal": "gpu_hw", "node": bad}
    )
    ev = from_alert(alert, T, VIEW)
    assert ev.node is None and not ev.actionable


@pytest.mark.parametrize("bad", ["7 && halt", "7\n", "-7", "7.0", "12345678901"])
def test_bad_job_ids_are_not_actionable(bad: str) -> None:
    alert = Alert(
        status="firing",
        startsAt=T,
        labels={"signal": "gpu_hw", "node": "gpu01", "slurm_job_id": bad},
    )
    ev = from_alert(alert, T, VIEW)
    assert ev.job is None and not ev.actionable, ev


def test_policy_defaults_are_designs() -> None:
    p = load_policy(None)
    assert (p.mode, p.settle_seconds, p.retry_budget.max_requeues) == ("monitor", 20, 3)
    assert p.breaker.max_fraction == 0.10 and p.breaker.window.total_seconds() == 3600
    assert p.mode_of("drain") == "monitor"
    assert load_policy({"actions": {"drain": "enforce"}}).mode_of("drain") == "enforce"


def test_an_action_s_mode_may_depend_on_its_cause_and_partition() -> None:
    p = load_policy(
        {
            "mode": "approve",
            "actions": {"requeue": "approve"},
            "causes": {"gpu_hardware": {"requeue": "enforce"}},
            "partitions": {
                "canary": {"mode": "enforce"},
                "big": {
                    "actions": {"requeue": "approve"},
                    "causes": {"degraded": {"requeue": "monitor"}},
                },
            },
        }
    )
    # The policy's cause first, then its action, then its mode.
    assert p.mode_of("requeue", None, "gpu_hardware") == "enforce"
    assert p.mode_of("requeue", None, "degraded") == "approve"
    assert p.mode_of("requeue") == "approve"
    # A partition's own keys before the policy's: its cause, its action, its mode.
    assert p.mode_of("requeue", "big", "degraded") == "monitor"
    assert p.mode_of("requeue", "big", "gpu_hardware") == "approve"
    assert p.mode_of("requeue", "canary", "degraded") == "enforce"
    assert p.mode_of("drain", "other", "gpu_hardware") == "approve"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"mode": "yolo"}, "mode: Input should be"),
        ({"causes": {"cosmic_rays": {"requeue": "enforce"}}}, "causes.cosmic_rays"),
        ({"causes": {"degraded": {"reflash": "enforce"}}}, "causes.degraded.reflash"),
        ({"breaker": {"max_fractoin": 1}}, "breaker.max_fractoin: unknown key"),
        ({"retry_budget": {"window": "soon"}}, "retry_budget.window: 'soon' is not a duration"),
        ({"actions": {"reflash": "enforce"}}, "actions.reflash"),
    ],
)
def test_bad_policy_names_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("(", r"\(")):
        load_policy(data)


def run_replay(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", "replay", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s.pop("start"), "start: Field required"),
        (lambda s: s["cluster"]["nodes"][0].update(names="gpu[01-"), "cluster.nodes.0.names"),
        (
            lambda s: s["events"][0].update(at="2026-11-29T11:00:00Z"),
            "events.0.at: outside start..until",
        ),
        (lambda s: s["events"][0]["alerts"][0].update(status="maybe"), "events.0.alerts.0.status"),
        (
            lambda s: s.update(policy={"breaker": {"max_fraction": 5}}),
            "policy.breaker.max_fraction",
        ),
    ],
)
def test_invalid_scenarios_exit_2_with_one_line_naming_the_field(
    tmp_path: Path, edit, field: str
) -> None:  # type: ignore[no-untyped-def]
    spec = yaml.safe_load((REPO / "tests" / "data" / "xid79-one-node.yaml").read_text())
    edit(spec)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = run_replay(path)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], out.stderr


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("name: [unclosed")
    assert run_replay(bad).returncode == 2 and "not YAML" in run_replay(bad).stderr
    assert run_replay(tmp_path / "nope.yaml").returncode == 2


def _scenario(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    spec = yaml.safe_load((REPO_SCENARIOS / "mode-approve.yaml").read_text())
    edit(spec)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_replay_check_fails_when_expect_does_not_hold(tmp_path: Path) -> None:
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "replay",
            str(REPO_SCENARIOS / "mode-approve.yaml"),
            "--json",
            "--check",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    plain = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "replay",
            str(REPO_SCENARIOS / "mode-approve.yaml"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.stdout == plain.stdout  # the contract's output is the same

    def wrong(spec: dict[str, Any]) -> None:
        spec["expect"]["decisions"][0]["mode"] = "enforce"
        spec["expect"]["never"].append({"action": "requeue"})

    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "replay", str(_scenario(tmp_path, wrong)), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert "expected, not decided: {'action': 'drain'" in lines[0]
    assert "decided, but never expected ({'action': 'requeue'})" in lines[1]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda s: s["events"][0]["alerts"][0]["labels"].update(signal="node_dwn"),
            "events.0.alerts.0.labels.signal: 'node_dwn' is not one of",
        ),
        (
            lambda s: s["cluster"]["jobs"][0].update(state="RUNING"),
            "cluster.jobs.0.state: 'RUNING' is not a Slurm job state",
        ),
        (
            lambda s: s["cluster"]["jobs"][0].update(nodes="gpu[01-05]"),
            "cluster.jobs.0.nodes: 'gpu05' is not a node of the scenario's cluster",
        ),
    ],
)
def test_a_scenario_refuses_what_it_would_silently_ignore(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], named: str
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "replay", str(_scenario(tmp_path, edit))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and named in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# What the engine keeps, that only the engine changes (its inputs are its methods).
ENGINE_STATE = {"guards", "seen", "incidents", "decided_on", "failing", "forgotten_nodes"}
MUTATORS = {"append", "extend", "update", "add", "pop", "clear", "remove", "insert", "discard"}


def _engine_writes(tree: ast.AST) -> list[str]:
    """Writes outside the core into an engine's state: `x.engine.guards... = `, `del`, augmented
    assignment, or a mutating method called on it (`x.engine.guards.history.append(...)`)."""

    def reaches_state(node: ast.AST) -> bool:
        if not isinstance(node, ast.Attribute | ast.Subscript):
            return False  # a name bound anew is no write into anything
        while isinstance(node, ast.Attribute | ast.Subscript):
            if isinstance(node, ast.Attribute) and node.attr == "guards":
                return True  # the guards' memory, wherever it was reached from
            if isinstance(node, ast.Attribute) and node.attr in ENGINE_STATE:
                inner = node.value
                name = inner.attr if isinstance(inner, ast.Attribute) else getattr(inner, "id", "")
                if name == "engine":
                    return True
            node = node.value
        return isinstance(node, ast.Name) and node.id == "guards"

    found = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = list(getattr(node, "targets", None) or [node.target])  # type: ignore[attr-defined]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        found += [ast.unparse(t) for t in targets if reaches_state(t)]
    return found


def test_no_module_outside_the_core_writes_the_engine_s_state() -> None:
    """Every change of the engine's state is an input to it (Engine.receive, tick, update_view,
    close, restore, settle, switch, reset_breaker, judged): the loop, the verifier, the
    simulator and replay call those, and never write its guards or incidents themselves."""
    package = REPO / "webhook"
    writes = {
        str(path.relative_to(REPO)): found
        for path in sorted(package.rglob("*.py"))
        if "core" not in path.relative_to(package).parts[:1]
        and (found := _engine_writes(ast.parse(path.read_text())))
    }
    assert writes == {}
    # And the check finds such a write where there is one.
    sample = (
        "self.engine.guards.history.append(kept)\n"
        "loop.engine.guards.monitor_forced = True\n"
        "guards.history.append(kept)\n"
        "loop.engine.incidents.pop(key)\n"
        "loop.engine.view.jobs.get(7)\n"
    )
    assert sorted(_engine_writes(ast.parse(sample))) == [
        "guards.history",
        "loop.engine.guards.monitor_forced",
        "loop.engine.incidents",
        "self.engine.guards.history",
    ]
