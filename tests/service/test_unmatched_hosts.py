"""An alert whose host is no node of the cluster is never acted on, and never silent: the live
loop logs each such host once and counts its alerts in the ledger (/metrics and the console
show them: test_console.py); with the policy's node_names the same alert is acted on."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest

from tests.service.test_loop_guards import T0, Clock, alert, view
from webhook.core.policy import load_policy
from webhook.ledger.settings import Unmatched
from webhook.ledger.store import Ledger
from webhook.service.loop import LiveLoop

FQDN = "gpu01.cluster.example.org"


def test_the_loop_logs_each_host_once_and_counts_every_alert(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    clock = Clock()
    loop = LiveLoop(ledger, load_policy({"settle_seconds": 5}), view, clock=clock)
    with caplog.at_level(logging.WARNING, logger="slurmedic.loop"):
        for i in range(3):
            alert(ledger, "GpuXidNodeFault", "gpu_hw", FQDN, 1, T0 + timedelta(seconds=i))
            clock.now = T0 + timedelta(seconds=10 * (i + 1))
            assert loop.step() == []
    said = [r.getMessage() for r in caplog.records if FQDN in r.getMessage()]
    assert said == [
        f"GpuXidNodeFault names {FQDN}, which is no node of the cluster: not acted on "
        "(its short name gpu01 is a node: set node_names.strip_domain)"
    ]
    counted = ledger.setting(Unmatched)
    assert counted.alerts == 3 and list(counted.hosts) == [FQDN]
    assert counted.hosts[FQDN].hint.endswith("set node_names.strip_domain")

    # A restart feeds the last hour again: said again, not counted again.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slurmedic.loop"):
        again = LiveLoop(ledger, load_policy({"settle_seconds": 5}), view, clock=clock)
        again.step()
    assert [r for r in caplog.records if FQDN in r.getMessage()]
    assert ledger.setting(Unmatched).alerts == 3

    # Mapped, the same alerts are a node's failure.
    mapped = LiveLoop(
        ledger,
        load_policy({"settle_seconds": 5, "node_names": {"strip_domain": True}}),
        view,
        clock=clock,
    )
    alert(ledger, "GpuXidNodeFault", "gpu_hw", FQDN, 1, clock.now)
    clock.now += timedelta(seconds=10)
    decided = mapped.step()
    assert ("drain", ("gpu01",)) in [(d.action, d.nodes) for d in decided]
    assert ledger.setting(Unmatched).alerts == 3
