"""The live loop forgets by the policy's retention, and a restart restores the same span: a node
drained days ago that fails again is drained again under its next key, and an incident decided
within the retention is still revised after a restart."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from tests.service.test_loop_revisions import T0, deliver, idle_node_fault, loop, xid79


def test_a_node_drained_days_ago_is_forgotten_and_drained_again_when_it_fails(
    tmp_path: Path,
) -> None:
    ledger, policy, clock, live = idle_node_fault(tmp_path)
    clock.now += timedelta(seconds=10)
    assert [(d.incident, d.action) for d in live.step()] == [("node:gpu07", "drain")]

    # Three days on, without a restart: the engine has forgotten the incident...
    clock.now = T0 + timedelta(days=3)
    assert live.step() == []
    assert "node:gpu07" not in live.engine.incidents
    # ...and the node's next failure is a new one, under the next key; its drain is still
    # remembered (repeats.window, 7d): a repeat, a hardware suspect.
    deliver(ledger, clock.now, xid79("gpu07", clock.now))
    clock.now += timedelta(seconds=10)
    assert [(d.incident, d.action, d.note) for d in live.step()] == [
        ("node:gpu07:2", "drain", "repeat 2 in 7d"),
        ("node:gpu07:2", "escalate", ""),
    ]

    # A restart three days later still: the ledger's incidents are past the retention, so
    # they are forgotten as well, and the next failure gets the key after the last one.
    clock.now = T0 + timedelta(days=6)
    live = loop(ledger, policy, clock)
    assert live.step() == []
    assert live.engine.incidents == {}
    deliver(ledger, clock.now, xid79("gpu07", clock.now))
    clock.now += timedelta(seconds=10)
    # The drains of the last 7 days read back from the ledger: the third in a week.
    assert [(d.incident, d.action, d.note) for d in live.step()] == [
        ("node:gpu07:3", "drain", "repeat 3 in 7d"),
        ("node:gpu07:3", "escalate", ""),
    ]
    assert [(r.incident, r.action) for r in ledger.decisions()] == [
        ("node:gpu07:3", "escalate"),
        ("node:gpu07:3", "drain"),
        ("node:gpu07:2", "escalate"),
        ("node:gpu07:2", "drain"),
        ("node:gpu07", "drain"),
    ]


def test_a_restart_reads_old_incidents_as_keys_alone(tmp_path: Path) -> None:
    """Past the retention the ledger hands back keys and times, not evidence or decisions:
    what a restart reads is bounded by the retention, not by the ledger's age."""
    ledger, policy, clock, live = idle_node_fault(tmp_path)
    clock.now += timedelta(seconds=10)
    assert [d.incident for d in live.step()] == ["node:gpu07"]
    clock.now = T0 + timedelta(days=2)
    deliver(ledger, clock.now, xid79("gpu08", clock.now))
    live = loop(ledger, policy, clock)
    clock.now += timedelta(seconds=10)
    assert [d.incident for d in live.step()] == ["node:gpu08"]

    restored = {i.key: i for i in ledger.restore_incidents(since=clock.now - timedelta(days=1))}
    old, recent = restored["node:gpu07"], restored["node:gpu08"]
    assert not old.current and not old.known and old.standing == ()
    assert recent.known and [d.action for d in recent.standing] == ["drain"]
