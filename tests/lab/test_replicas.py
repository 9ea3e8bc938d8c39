"""Two `slurmedic serve` on one PostgreSQL ledger in the lab, enforce mode, Alertmanager
delivering every notification to both (as an HA pair of Alertmanagers may deliver to either):
one replica leads, and each fault gets one drain and one requeue, each run once. When the
leader is killed with a run in flight, the follower takes over and finishes it; a replica
that comes back follows."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import manage
from lab.config import LabConfig
from tests.lab.conftest import PLAYBOOK_RUN_S, eventually
from tests.lab.replicas import (
    LEASE,
    Replicas,
    carried_out,
    claims,
    executed_once,
    reached,
    replicas,
    restarted_once,
    waiting,
)
from tests.lab.test_remediation import checkpointed_job

pytestmark = pytest.mark.lab


@pytest.fixture
def pair(lab_cfg: LabConfig, tmp_path: Path) -> Iterator[Replicas]:
    with replicas(lab_cfg, tmp_path, "ab", "replicas") as r:
        yield r


def test_two_replicas_carry_out_each_action_once(
    lab_cfg: LabConfig, pair: Replicas, submit: Callable[..., int]
) -> None:
    leader = pair.leader()
    follower = next(n for n in pair.ports if n != leader)
    assert pair.readyz(leader)["leading"] and not pair.readyz(follower)["leading"]
    assert pair.metric(leader, "slurmedic_replica_leading", replica=leader) == 1
    assert pair.metric(follower, "slurmedic_replica_leading", replica=follower) == 0
    job, nodes = checkpointed_job(lab_cfg, submit)
    manage.inject_gpu(lab_cfg, "xid", nodes[1], 4, xid=79)
    incident = f"{job}.0"
    rows = waiting(
        pair, job, carried_out(pair.ledger, incident), "drain and requeue", timeout=PLAYBOOK_RUN_S
    )
    # One decision of each, each claimed once, by the leader's term.
    executed_once(pair, incident, rows)
    for row in rows.values():
        (claim,) = claims(pair.ledger, row)
        assert (claim["replica"], claim["attempt"]) == (leader, 1)
    # Both replicas took Alertmanager's notifications (each stored them; the ledger kept one
    # event of each alert).
    for name in pair.ports:
        assert pair.metric(name, "slurmedic_webhook_requests_total", code="200") > 0
    restarted_once(lab_cfg, job, nodes[1])


def test_a_follower_takes_over_a_killed_leader_and_finishes_its_run_once(
    lab_cfg: LabConfig, pair: Replicas, submit: Callable[..., int]
) -> None:
    leader = pair.leader()
    follower = next(n for n in pair.ports if n != leader)
    term = pair.metric(leader, "slurmedic_leader_term")
    job, nodes = checkpointed_job(lab_cfg, submit)
    manage.inject_gpu(lab_cfg, "xid", nodes[1], 4, xid=79)
    incident = f"{job}.0"
    # The leader dies while it carries out the drain (its playbook runs on, in a session of
    # its own, as ansible-runner starts it): the ledger says `running`, nobody will end it.
    running = reached(pair, job, "running")
    pair.kill(leader)
    killed_at = time.monotonic()
    eventually(lambda: pair.readyz(follower)["leading"], timeout=4 * LEASE + 30, what="a takeover")
    print(f"takeover {time.monotonic() - killed_at:.1f} s after the kill (lease {LEASE} s)")
    assert pair.metric(follower, "slurmedic_leader_term") == term + 1
    rows = waiting(
        pair, job, carried_out(pair.ledger, incident), "drain and requeue", timeout=PLAYBOOK_RUN_S
    )
    executed_once(pair, incident, rows)
    # The run the leader left `running` was run again by the follower's term, once.
    (left,) = running
    assert [(c["replica"], c["attempt"]) for c in claims(pair.ledger, rows[left.action])] == [
        (leader, 1),
        (follower, 2),
    ]
    # The job was requeued once, whoever ran it.
    restarted_once(lab_cfg, job, nodes[1])
    # The killed replica comes back as a follower.
    pair.start(leader)
    assert pair.readyz(leader)["leader"] == follower and not pair.readyz(leader)["leading"]


def test_a_leader_paused_past_its_lease_claims_nothing_when_it_wakes(
    lab_cfg: LabConfig, pair: Replicas, submit: Callable[..., int]
) -> None:
    leader = pair.leader()
    follower = next(n for n in pair.ports if n != leader)
    # SIGSTOP of the whole replica past its lease. Alertmanager's copies to it wait; the
    # follower's arrive.
    pair.pause(leader, True)
    try:
        eventually(
            lambda: pair.readyz(follower)["leading"], timeout=4 * LEASE + 30, what="a takeover"
        )
        job, nodes = checkpointed_job(lab_cfg, submit)
        manage.inject_gpu(lab_cfg, "xid", nodes[1], 4, xid=79)
        incident = f"{job}.0"
        rows = waiting(
            pair,
            job,
            carried_out(pair.ledger, incident),
            "drain and requeue",
            timeout=PLAYBOOK_RUN_S,
        )
    finally:
        pair.pause(leader, False)
    # Awake, the old leader learns its term is over and follows: it decides and runs nothing.
    eventually(
        lambda: (r := pair.readyz(leader))["code"] == 200 and r["leader"] == follower,
        timeout=60,
        what="the woken replica following",
    )
    assert not pair.readyz(leader)["leading"]
    executed_once(pair, incident, rows)
    for row in rows.values():
        assert [(c["replica"], c["attempt"]) for c in claims(pair.ledger, row)] == [(follower, 1)]
    restarted_once(lab_cfg, job, nodes[1])
