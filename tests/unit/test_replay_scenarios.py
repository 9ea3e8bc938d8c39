"""Every scenario, the shared ones and ours, through the real CLI: `slurmedic replay FILE --json`.

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

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "scenarios"
FILES = sorted(SHARED.glob("*.yaml")) + sorted((REPO / "tests" / "scenarios").glob("*.yaml"))
CLI = [sys.executable, "-m", "webhook.cli"]


def matches(decision: dict[str, Any], want: dict[str, Any], *, overlap: bool) -> bool:
    for key, value in want.items():
        got = decision.get(key)
        if isinstance(value, list):
            got_set, want_set = set(got or []), set(value)
            if (not got_set & want_set) if overlap else got_set != want_set:
                return False
        elif got != value:
            return False
    return True


def replay(path: Path) -> dict[str, Any]:
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
            "shared_infrastructure",
            "application",
            "hang",
            "straggler",
            "unknown",
        }
        assert d["reason"] and d["nodes"] == sorted(d["nodes"])
    expect = spec.get("expect") or {}
    assert expect, f"{path.name} has no expect"
    brief = [(d["action"], d["nodes"], d["exclude"], d["cause"], d["guard"]) for d in decisions]
    for want in expect.get("decisions", []):
        assert any(matches(d, want, overlap=False) for d in decisions), (
            f"expected {want}; got {brief}"
        )
    for never in expect.get("never", []):
        bad = [d for d in decisions if matches(d, never, overlap=True)]
        assert not bad, f"never {never}; got {bad}"
