"""The replicas' own faults, in the lab: three `slurmedic serve` in enforce mode on one
PostgreSQL, two Alertmanagers clustered with each other (gossip on loopback) that Prometheus
both sends to, each delivering every notification to all three replicas. Each test injects a
GPU fault and, at a set point of its handling, a fault of the service's own parts; then it
counts what the fault table holds (each test prints its row): alerts that fired about the
job against those in the ledger, webhook answers 5xx, Slurm's own count of requeues and
drains, decisions, and the time from the fault's end until one replica leads.

This is the fault suite's short form, in CI; its long form, `bench/faults.py`, injects these
faults and more at random points, many times, and prints the whole table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import manage, monitoring, postgres
from lab.config import LabConfig
from tests.lab.conftest import eventually
from tests.lab.replicas import (
    Replicas,
    all_stored,
    carried_out,
    claims,
    executed_once,
    incident_rows,
    leads_again,
    reached,
    replicas,
    restarted_once,
    table_row,
    waiting,
)
from tests.lab.test_remediation import checkpointed_job

pytestmark = [pytest.mark.lab, pytest.mark.one_stack]


@pytest.fixture
def trio(lab_cfg: LabConfig, tmp_path: Path) -> Iterator[Replicas]:
    try:
        monitoring.add_peer(lab_cfg)
        with replicas(lab_cfg, tmp_path, "abc", "faults") as r:
            yield r
    finally:
        monitoring.remove_peer(lab_cfg)


def survived(r: Replicas, job: int, drained: str, fault: str, back: float) -> dict[str, object]:
    """One drain and one requeue, each run once, the job restarted once, nothing that was
    acknowledged missing from the ledger; the fault table's row."""
    incident = f"{job}.0"
    rows = waiting(r, job, carried_out(r.ledger, incident), "drain and requeue", timeout=180)
    executed_once(r, incident, rows)
    restarted_once(r.cfg, job, drained)
    all_stored(r, job)
    row = table_row(fault, r, job, drained, back)
    # Each new event a replica acknowledged is in the ledger (the ledger may hold more: a
    # commit whose answer was lost in the fault counts as a duplicate when sent again).
    assert row["new events acknowledged"] <= row["events stored"], row  # type: ignore[operator]
    return row


def test_postgresql_restarted_while_a_playbook_runs(
    lab_cfg: LabConfig, trio: Replicas, submit: Callable[..., int]
) -> None:
    trio.leader()
    job, nodes = checkpointed_job(lab_cfg, submit)
    manage.inject_gpu(lab_cfg, "xid", nodes[1], 4, xid=79)
    # The leader is carrying out a decision: its end (and the next claim) meets a server that
    # has cut every session.
    reached(trio, job, "running")
    postgres.restart(lab_cfg)
    back = leads_again(trio, time.monotonic())
    survived(trio, job, nodes[1], "PostgreSQL restarted mid-playbook", back)


def test_postgresql_unreachable_for_30_seconds_while_the_alerts_arrive(
    lab_cfg: LabConfig, trio: Replicas, submit: Callable[..., int]
) -> None:
    trio.leader()
    job, nodes = checkpointed_job(lab_cfg, submit)
    postgres.pause(lab_cfg, True)
    paused = time.monotonic()
    try:
        # The fault comes while the ledger answers nothing: Alertmanager's deliveries of its
        # alerts get no answer (the webhook cannot store them), nor can any lease be renewed.
        manage.inject_gpu(lab_cfg, "xid", nodes[1], 4, xid=79)
        reached(trio, job, "alert")
        # The outage lasts 30 s from its start: its length is what is tested.
        time.sleep(max(0.0, 30 - (time.monotonic() - paused)))
    finally:
        postgres.pause(lab_cfg, False)
    back = leads_again(trio, time.monotonic())
    survived(trio, job, nodes[1], "PostgreSQL unreachable 30 s", back)


def test_a_leader_whose_disk_fills_hands_over_and_says_why(
    lab_cfg: LabConfig, trio: Replicas, submit: Callable[..., int]
) -> None:
    leader = trio.leader()
    job, nodes = checkpointed_job(lab_cfg, submit)
    manage.inject_gpu(lab_cfg, "xid", nodes[1], 4, xid=79)
    # The fault's alert is on its way: the leader's disk fills before it has decided (the
    # settle window); bench.faults fills it at random points, a playbook in flight too.
    reached(trio, job, "alert")
    trio.disks[leader].fill()
    filled = time.monotonic()
    try:
        body = eventually(
            lambda: (r := trio.readyz(leader))["code"] == 503 and r,
            what=f"{leader}'s /readyz saying it cannot run playbooks",
        )
        assert "this host cannot run playbooks" in body["reason"], body
        assert "No space left on device" in body["reason"], body
        # Another replica leads, and carries the decisions out once.
        back = leads_again(trio, filled, not_=leader)
        new = trio.leader()
        survived(trio, job, nodes[1], "the leader's disk full", back)
        for row in incident_rows(trio.ledger, f"{job}.0"):
            assert [c["replica"] for c in claims(trio.ledger, row)] == [new], row
    finally:
        trio.disks[leader].free()
    # With room again, it is ready, and follows.
    eventually(lambda: trio.readyz(leader)["code"] == 200, what=f"{leader} ready again")
    assert trio.readyz(leader)["leader"] == new
