"""Each node's failures, the lemons first, where people read them: `slurmedic nodes` (the real
command), the console's nodes page and /metrics, all from one real SQLite ledger."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from tests.service.conftest import console_config
from tests.service.test_console import login, users
from webhook.app import create_app
from webhook.core.decisions import Decision
from webhook.core.failures import Failure
from webhook.ledger.settings import Modes
from webhook.ledger.store import Ledger
from webhook.service.config import ServiceConfig

NOW = datetime.now(UTC).replace(microsecond=0)


def drain(at: datetime, node: str, incident: str, state: str = "recorded") -> Decision:
    return Decision(
        at=at,
        incident=incident,
        job=None,
        action="drain",
        cause="gpu_hardware",
        reason=f"XID 79 on {node}",
        nodes=(node,),
        mode="monitor",
        state=state,
    )


@pytest.fixture
def ledger_and_config(tmp_path: Path) -> tuple[Ledger, Path, ServiceConfig]:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(db)
    ledger.put(Modes(repeats_window_seconds=7 * 86400, repeats_count=2), NOW)
    ledger.record(
        [
            drain(NOW - timedelta(days=3), "gpu05", "node:gpu05"),
            drain(NOW - timedelta(days=1), "gpu05", "node:gpu05:2"),
            drain(NOW - timedelta(days=2), "gpu06", "node:gpu06"),
            # Forty days ago: outside the default 30 days.
            drain(NOW - timedelta(days=40), "gpu06", "node:gpu06:0"),
        ]
    )
    (rejected,) = ledger.record(
        [drain(NOW - timedelta(hours=5), "gpu06", "node:gpu06:2", state="awaiting_approval")]
    )
    ledger.add_event(rejected, "rejected", {"by": "anna", "reason": "healthy"}, NOW)
    xids = [
        Failure(at=NOW - timedelta(hours=h), node="gpu07", kind="xid:31", job=j, gpu="GPU-c")
        for h, j in ((6, 11), (4, 12))
    ]
    ledger.record([], failures=xids)
    config = console_config(tmp_path, db, users(tmp_path / "users.yml"))
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump({"database_url": db}))
    return ledger, path, config


def nodes(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", "nodes", f"--config={config}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_slurmedic_nodes_lists_the_lemons_first(
    ledger_and_config: tuple[Ledger, Path, ServiceConfig],
) -> None:
    _, path, _ = ledger_and_config
    out = nodes(path, "--json")
    assert out.returncode == 0, out.stderr
    got = [(r["node"], r["failures"], r["suspect"]) for r in json.loads(out.stdout)]
    # gpu05 drained twice in a week; gpu07's GPU faulted under two jobs; gpu06's other drains
    # are past 30 days or were rejected.
    assert got == [("gpu07", 2, True), ("gpu05", 2, True), ("gpu06", 1, False)]
    wider = json.loads(nodes(path, "--json", "--since", "60d").stdout)
    assert [(r["node"], r["failures"]) for r in wider][-1] == ("gpu06", 2)
    table = nodes(path)
    assert table.returncode == 0 and "gpu05" in table.stdout and "suspect" in table.stdout
    bad = nodes(path, "--since", "a week")
    assert bad.returncode == 2 and "--since" in bad.stderr and "a week" in bad.stderr


def test_the_console_and_metrics_show_them(
    ledger_and_config: tuple[Ledger, Path, ServiceConfig],
) -> None:
    ledger, _, config = ledger_and_config
    client = create_app(config, ledger).test_client()
    login(client, "vera")
    page = client.get("/console/nodes").get_data(as_text=True)
    assert page.index("gpu07") < page.index("gpu05") < page.index("gpu06")
    assert page.count('class="suspect"') == 2
    assert client.get("/console/nodes?days=zero").status_code == 400
    assert client.get("/console/nodes?days=%C2%B2").status_code == 400
    text = client.get("/metrics").get_data(as_text=True)
    assert 'slurmedic_node_failures{node="gpu05"} 2.0' in text
    assert 'slurmedic_node_suspect{node="gpu07"} 1.0' in text
    assert 'slurmedic_node_suspect{node="gpu06"} 0.0' in text
