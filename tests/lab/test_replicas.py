"""Two `slurmedic serve` on one PostgreSQL ledger in the lab, enforce mode, Alertmanager
delivering every notification to both (as an HA pair of Alertmanagers may deliver to either):
one replica leads, and each fault gets one drain and one requeue, each run once. When the
leader is killed with a run in flight, the follower takes over and finishes it; a replica
that comes back follows.

Fencing that reaches Slurm: a leader whose whole process tree is paused between its
playbook's read of Slurm and its act, for longer than its lease, as a VM pause falls. The
follower takes over and carries the incident out; the woken leader's playbook must then act on
nothing: not requeue the running successor a second time, not drain again a node a person has
resumed since. Slurm's own log is the judge; bench/faults.py runs the same faults many times."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import manage
from lab.config import LabConfig
from lab.slurm import node_states
from tests.lab.conftest import PLAYBOOK_RUN_S, eventually, job_story, next_attempt
from tests.lab.replicas import (
    LEASE,
    Replicas,
    act_windows,
    carried_out,
    claims,
    executed_once,
    mended,
    paused_after,
    reached,
    replicas,
    restarted_once,
    slurm_actions,
    waiting,
)
from tests.lab.test_remediation import checkpointed_job
from webhook.ledger.store import Ledger

pytestmark = pytest.mark.lab


@pytest.fixture
def pair(lab_cfg: LabConfig, tmp_path: Path) -> Iterator[Replicas]:
    with replicas(lab_cfg, tmp_path, "ab", "replicas") as r:
        yield r


@pytest.mark.one_stack
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
    # The whole chain, alert to both runs: past 120 s at load 10 on 2 CPUs (two labs).
    rows = waiting(pair, job, carried_out(pair.ledger, incident), "drain and requeue", timeout=180)
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


@pytest.mark.one_stack
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
    # The whole chain, alert to both runs: past 120 s at load 10 on 2 CPUs (two labs).
    rows = waiting(pair, job, carried_out(pair.ledger, incident), "drain and requeue", timeout=180)
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


@pytest.mark.one_stack
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


def drained(cfg: LabConfig, node: str) -> bool:
    return node_states(cfg)[node].startswith(("drain", "drng"))


def woken(pair: Replicas, name: str, stopped: list[int], leader: str) -> None:
    """Continue the paused replica; wait until its runs have ended and it follows."""
    pair.pause_tree(name, False, stopped)
    eventually(lambda: not pair.runs(name), timeout=PLAYBOOK_RUN_S, what=f"{name}'s runs ended")
    eventually(
        lambda: (r := pair.readyz(name))["code"] == 200 and r["leader"] == leader,
        timeout=60,
        what=f"{name} following",
    )


def test_a_leader_paused_between_its_read_and_its_requeue_requeues_nothing_when_it_wakes(
    lab_cfg: LabConfig, pair: Replicas, submit: Callable[..., int]
) -> None:
    leader = pair.leader()
    follower = pair.others(leader)[0]
    job, nodes = checkpointed_job(lab_cfg, submit)
    manage.inject_gpu(lab_cfg, "xid", nodes[1], 4, xid=79)
    incident = f"{job}.0"
    # The leader's requeue has read the job (Restarts=0) and is paused before its requeuehold.
    stopped = paused_after(pair, leader, ["scontrol", "show", "job", str(job), "--oneliner"])
    paused = time.monotonic()
    try:
        assert slurm_actions(lab_cfg, job, nodes[1])[0] == 0, "the pause fell after the requeue"
        eventually(
            lambda: pair.readyz(follower)["leading"], timeout=4 * LEASE + 30, what="a takeover"
        )
        print(f"takeover {time.monotonic() - paused:.1f} s after the pause (lease {LEASE} s)")
        rows = waiting(
            pair, job, carried_out(pair.ledger, incident), "drain and requeue", timeout=120
        )
        # The successor runs: what a stale requeue would kill.
        next_attempt(lab_cfg, job, 1)
        assert time.monotonic() - paused > LEASE
    finally:
        woken(pair, leader, stopped, follower)
    executed_once(pair, incident, rows)
    # The paused leader's claim, then the follower's. Under load the follower may claim it more
    # than once (its first act fenced, seen at load 10: run again, acting once, as above).
    claimed = [c["replica"] for c in claims(pair.ledger, rows["requeue"])]
    assert claimed[0] == leader and claimed[1:] and set(claimed[1:]) == {follower}, claimed
    # One requeue and one drain in Slurm's own log; the successor still runs, restarted once.
    assert slurm_actions(lab_cfg, job, nodes[1]) == (1, 1), job_story(lab_cfg, job)
    info = manage.show_job(lab_cfg, job)
    assert (info["JobState"], info["Restarts"]) == ("RUNNING", "1"), job_story(lab_cfg, job)
    # Both acts checked after the fact: Slurm shows what was decided.
    assert [r.mismatch for r in pair.ledger.rows([r.id for r in rows.values()])] == [None, None]
    print("act windows ms:", act_windows(pair.ledger, rows))


def test_a_leader_paused_before_its_drain_does_not_drain_again_a_node_a_person_resumed(
    lab_cfg: LabConfig, pair: Replicas, submit: Callable[..., int]
) -> None:
    leader = pair.leader()
    follower = pair.others(leader)[0]
    job, nodes = checkpointed_job(lab_cfg, submit)
    bad = nodes[1]
    manage.inject_gpu(lab_cfg, "xid", bad, 4, xid=79)
    incident = f"{job}.0"
    # The leader's drain has read the node (not drained) and is paused before its drain.
    stopped = paused_after(pair, leader, ["scontrol", "show", "node", bad, "--oneliner"])
    try:
        assert slurm_actions(lab_cfg, job, bad)[1] == 0, "the pause fell after the drain"
        eventually(
            lambda: pair.readyz(follower)["leading"], timeout=4 * LEASE + 30, what="a takeover"
        )
        rows = waiting(
            pair, job, carried_out(pair.ledger, incident), "drain and requeue", timeout=120
        )
        assert [r.mismatch for r in pair.ledger.rows([rows["drain"].id])] == [None]
        # A person has looked at the node and put it back in service.
        mended(lab_cfg, bad)
        eventually(lambda: not drained(lab_cfg, bad), what=f"{bad} resumed")
    finally:
        woken(pair, leader, stopped, follower)
    # One drain for the incident in Slurm's log: the woken leader's was refused. (slurmedic
    # may rightly drain the node again for a failure of its own once the job left it, as a
    # repeat: its reason names the node, not the job.)
    assert slurm_actions(lab_cfg, job, bad)[1] == 1, job_story(lab_cfg, job)


@pytest.mark.one_stack
def test_lab_postgres_gives_a_database_replicas_can_share(lab_cfg: LabConfig) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "lab", "postgres", "--database", "from_the_cli"],
        env=lab_cfg.env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    url = out.stdout.strip().splitlines()[-1]
    assert url.startswith("postgresql") and url.endswith("/from_the_cli"), out.stdout
    ledger = Ledger(url)  # migrated at first use, as a replica's
    assert ledger.leases.hold("a", None, 5.0) is not None
