"""`slurmedic decisions list/show` and `review` read the ledger a human looks at."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import yaml

from webhook.core.decisions import Decision
from webhook.ledger.store import Ledger

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
COMMAND = 'scontrol update nodename=gpu01 state=drain reason="slurmedic: 7.0 gpu_hardware"'


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args, f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_list_show_and_review(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"database_url": db}))
    ledger = Ledger(db)
    drain = Decision(
        at=T,
        incident="7.0",
        job=7,
        action="drain",
        cause="gpu_hardware",
        reason="XID 79 on gpu01 GPU 3",
        nodes=("gpu01",),
        mode="approve",
        state="awaiting_approval",
        evidence=(
            {
                "alertname": "GpuXidNodeFault",
                "node": "gpu01",
                "startsAt": "2026-11-29T11:59:50Z",
                "fingerprint": "abc",
            },
        ),
    )
    (decision_id,) = ledger.record([drain])
    ledger.add_event(
        decision_id,
        "awaiting_approval",
        {
            "by": "executor",
            "dry_run": {
                "playbook": "drain_nodes",
                "status": "successful",
                "check": True,
                "rc": 0,
                "changed": [],
                "commands": [COMMAND],
            },
        },
        T,
    )

    listed = json.loads(cli(config, "decisions", "list", "--json").stdout)
    assert [(d["id"], d["action"], d["nodes"], d["state"]) for d in listed] == [
        (decision_id, "drain", ["gpu01"], "awaiting_approval")
    ]
    shown = cli(config, "decisions", "show", str(decision_id)).stdout
    assert "XID 79 on gpu01 GPU 3" in shown and "GpuXidNodeFault" in shown
    assert (
        'scontrol update nodename=gpu01 state=drain reason="slurmedic: 7.0 gpu_hardware"' in shown
    )
    assert "waiting for approval" in cli(config, "review").stdout
    missing = cli(config, "decisions", "show", "999")
    assert missing.returncode == 1 and "decision 999 is not in the ledger" in missing.stderr
    rejected = cli(config, "reject", str(decision_id), "--reason", "checkpointing first")
    assert rejected.returncode == 0
    assert cli(config, "review").stdout.strip() == "nothing waits for approval"
    events = json.loads(cli(config, "decisions", "show", str(decision_id), "--json").stdout)[
        "events"
    ]
    assert [e["state"] for e in events] == ["awaiting_approval", "awaiting_approval", "rejected"]
    assert events[-1]["detail"]["reason"] == "checkpointing first"
