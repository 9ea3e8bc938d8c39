"""Every scenario, the shared ones and ours. The shared ones (the contract's examples) go through
the real CLI, `slurmedic replay FILE --json`; ours through the same function in-process (the
CLI's own behaviour is tested in test_core_boundary.py), a process per file costs half a second.

A scenario's `expect` says which decisions must be there (every given key equal; lists as sets)
and which must never be (scalars equal, lists overlapping).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.executor.dispatch import playbook_for
from webhook.executor.runner import PLAYBOOK_VARS, DiagnosticsVars
from webhook.ledger.schema import DecisionRow
from webhook.replay import load, matches, replay_json, run

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "scenarios"
FILES = sorted(SHARED.glob("*.yaml")) + sorted((REPO / "tests" / "scenarios").glob("*.yaml"))
CLI = [sys.executable, "-m", "webhook.cli"]


def replay(path: Path) -> dict[str, Any]:
    if path.parent != SHARED:
        # Through JSON, as the CLI prints it: the output is compared as the contract has it.
        result_: dict[str, Any] = json.loads(json.dumps(replay_json(path)))
        return result_
    out = subprocess.run(
        [*CLI, "replay", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def assert_playbooks_take(d: dict[str, Any]) -> None:
    """What the executor would hand a decision's playbook (and a drain's diagnostics) passes the
    checks the playbooks make, with their own patterns: every incident key and drain reason,
    of the longest node names too (tests/scenarios/long-node-name*.yaml)."""
    row = DecisionRow(
        incident=d["incident"],
        job=d["job"],
        action=d["action"],
        cause=d["cause"],
        nodes=d["nodes"],
        exclude=d["exclude"],
    )
    if (target := playbook_for(row)) is not None:
        name, extravars = target
        PLAYBOOK_VARS[name].model_validate(extravars)
    if d["action"] == "drain":
        DiagnosticsVars(slurmedic_nodes=d["nodes"], slurmedic_incident=d["incident"])


def test_there_are_enough_scenarios() -> None:
    assert len(list(SHARED.glob("*.yaml"))) >= 4, f"shared scenarios missing at {SHARED}"
    assert len(list((REPO / "tests" / "scenarios").glob("*.yaml"))) >= 20


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_scenario(path: Path) -> None:
    spec = yaml.safe_load(path.read_text())
    result = replay(path)
    assert result["scenario"] == spec["name"]
    decisions = result["decisions"]
    for d in decisions:  # the contract's vocabulary and shape
        assert d["action"] in {"drain", "requeue", "stop", "escalate", "resume", "none"}
        assert d["cause"] in {
            "gpu_hardware",
            "node_failure",
            "network",
            "degraded",
            "shared_infrastructure",
            "application",
            "hang",
            "straggler",
            "unknown",
        }
        assert d["reason"] and d["nodes"] == sorted(d["nodes"])
        assert_playbooks_take(d)
    expect = spec.get("expect") or {}
    assert expect, f"{path.name} has no expect"
    # One incident gives at most one decision per action (docs/operations.md) in force: a superseded
    # one was replaced by a revision.
    per_action = [(d["incident"], d["action"]) for d in decisions if d["state"] != "superseded"]
    assert len(set(per_action)) == len(per_action), per_action
    brief = [(d["action"], d["nodes"], d["exclude"], d["cause"], d["guard"]) for d in decisions]
    for want in expect.get("decisions", []):
        assert any(matches(d, want, overlap=False) for d in decisions), (
            f"expected {want}; got {brief}"
        )
    for never in expect.get("never", []):
        bad = [d for d in decisions if matches(d, never, overlap=True)]
        assert not bad, f"never {never}; got {bad}"


def test_node_alert_lag_0_makes_a_late_alert_an_idle_node_s_failure() -> None:
    """The same crash as decide-xid-after-the-job-crashed-joins-its-failure with the lag
    off: the traceback alone decides the job's incident (an application failure: one rank's,
    requeued once), and the XID that came after the job's end is a failure of the idle gpu02."""
    scenario = load(
        REPO / "tests" / "scenarios" / "decide-xid-after-the-job-crashed-joins-its-failure.yaml"
    )
    off = scenario.model_copy(update={"policy": {"node_alert_lag": "0s"}})
    got = {(d.incident, d.action, d.cause) for d in run(off)}
    assert ("3110.0", "requeue", "application") in got
    assert ("node:gpu02", "drain", "gpu_hardware") in got
    assert not any(i == "3110.0" and a in ("drain", "stop") for i, a, _ in got)
