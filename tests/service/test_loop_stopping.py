"""A loop told to stop decides and starts nothing more: what it had read waits in the ledger
for the next loop (a stopping replica must not act beside the one that follows it)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from tests.service.test_loop_revisions import idle_node_fault, loop


def test_a_loop_told_to_stop_decides_nothing_and_the_next_one_does(tmp_path: Path) -> None:
    ledger, policy, clock, live = idle_node_fault(tmp_path)
    assert live.step() == []  # read, still settling
    clock.now += timedelta(seconds=10)
    live.stopping.set()  # SIGTERM arrives: the settle window has ended, but nothing is decided
    assert live.step() == []
    assert ledger.decisions() == []

    after = loop(ledger, policy, clock)
    assert [(d.incident, d.action) for d in after.step()] == [("node:gpu07", "drain")]
