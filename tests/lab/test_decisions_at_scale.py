"""Issue 36's decisions on the lab's real Slurm (enforce mode), on every stack.

1. Degraded hardware: NVLink errors rising under a training job drain the node and leave the
   job training (0 restarts, its steps going on); when its rank on that node then slows down,
   the job is requeued without the node.
2. One rank's crash (its CUDA error, the others timing out): requeued once, its owner told;
   nothing drained, nothing stopped.
3. A burst: the slurmd of three nodes on both leaf switches, under three jobs, killed at once.
   Nothing drained, nothing requeued by slurmedic, one escalation naming the three nodes; Slurm
   requeues its NODE_FAIL jobs itself and slurmedic leaves them alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import hostlist
import pytest

from lab import manage, monitoring
from lab.config import LabConfig
from lab.slurm import slurm
from tests.lab.conftest import (
    PLAYBOOK_RUN_S,
    eventually,
    query,
    running_nodes,
    serve_slurmedic,
)
from tests.lab.test_decisions import (
    DONE,
    in_force,
    loop_looked_after,
    running_again,
    step_of,
    summary,
    wait_rows,
)
from tests.lab.test_remediation import checkpointed_job, healthy_after, mapped, restore

pytestmark = pytest.mark.lab
__all__ = ["healthy_after"]  # the autouse fixture: each test leaves a healthy cluster


def sees_job(cfg: LabConfig, job: int) -> None:
    """slurmedic's own view has the job (its loop polls Slurm every few seconds): an alert
    before that is an idle node's failure."""
    eventually(
        lambda: query(cfg, f'slurmedic_job_eligible{{slurm_job_id="{job}"}} == 1'),
        what="slurmedic sees the job",
    )


def reason_of(cfg: LabConfig, node: str) -> str:
    return slurm(cfg, "sinfo", "-h", "-R", "-n", node, "-o", "%E").strip()


# ---- 1. degraded hardware ------------------------------------------------------------------


def test_nvlink_errors_drain_the_node_and_leave_the_job_training_until_it_slows(
    lab_cfg: LabConfig, submit: Callable[..., int], tmp_path: Path
) -> None:
    ledger = serve_slurmedic(lab_cfg, tmp_path, "enforce")
    try:
        job, nodes = checkpointed_job(lab_cfg, submit)
        sees_job(lab_cfg, job)
        bad = nodes[1]
        manage.inject_gpu(lab_cfg, "nvlink", bad, 1, rate=50)
        incident = f"{job}.0"
        rows = wait_rows(
            ledger,
            incident,
            lambda rs: (
                any(r.action == "drain" and r.state in DONE for r in rs)
                and any(r.action == "none" for r in rs)
            ),
            what="the drain carried out and the job left alone",
        )
        force = in_force(rows)
        assert set(force) == {"drain", "none"}, summary(rows)
        drain, left = force["drain"], force["none"]
        assert (drain.cause, drain.nodes, drain.state) == ("degraded", [bad], "executed")
        assert (left.cause, left.guard) == ("degraded", "job_running"), summary(rows)
        assert drain.evidence[0]["alertname"] == "GpuNvlinkErrors"
        # Slurm drains the node under the running job: nothing new lands there, the job goes on.
        assert reason_of(lab_cfg, bad) == f"slurmedic: {incident} degraded"
        info = manage.show_job(lab_cfg, job)
        assert (info["JobState"], info["Restarts"]) == ("RUNNING", "0"), info
        before = step_of(lab_cfg, job)
        eventually(
            lambda: step_of(lab_cfg, job) >= before + 10,
            timeout=60,
            what="the job still training after the drain",
        )
        assert manage.show_job(lab_cfg, job)["Restarts"] == "0"
        assert not [r for r in ledger.incident_decisions(incident) if r.action == "requeue"]
        # Its rank on the degraded node slows down: every collective waits for it.
        manage.inject_job(lab_cfg, "slow", job, 1, factor=4.0)
        rows = wait_rows(
            ledger,
            incident,
            lambda rs: any(r.action == "requeue" and r.state in DONE for r in rs),
            timeout=120,
            what="the requeue without the degraded node",
        )
        requeue = in_force(rows)["requeue"]
        assert (requeue.exclude, requeue.state) == ([bad], "executed"), summary(rows)
        # Weighed against the job's checkpoint, from its progress reports through the rule's
        # annotations: a checkpoint every few seconds here, so nothing is worth waiting for.
        assert "requeued now: it redoes" in requeue.reason, requeue.reason
        assert "times slower until the next" in requeue.reason, requeue.reason
        # The drain that ran is not repeated; the decision that left the job alone is replaced.
        drains = [r for r in rows if r.action == "drain"]
        assert [(r.nodes, r.state) for r in drains] == [([bad], "executed")], summary(rows)
        assert left.id in {r.id for r in rows if r.state == "superseded"}, summary(rows)
        new = running_again(lab_cfg, job, 1)
        assert bad not in new, new
        assert bad in manage.show_job(lab_cfg, job)["ExcNodeList"].split(",")
    finally:
        restore(lab_cfg)


# ---- 2. one rank's crash -------------------------------------------------------------------


def test_one_rank_s_crash_is_requeued_once_and_its_owner_told(
    lab_cfg: LabConfig, submit: Callable[..., int], tmp_path: Path
) -> None:
    ledger = serve_slurmedic(lab_cfg, tmp_path, "enforce")
    try:
        job, _ = checkpointed_job(lab_cfg, submit)
        sees_job(lab_cfg, job)
        manage.inject_job(lab_cfg, "crash_cuda", job, 1)  # rank 1 exits with a traceback
        incident = f"{job}.0"
        rows = wait_rows(
            ledger,
            incident,
            lambda rs: {"requeue", "escalate"} <= {r.action for r in rs if r.state in DONE},
            timeout=PLAYBOOK_RUN_S,
            what="the requeue and the escalation carried out",
        )
        force = in_force(rows)
        assert set(force) == {"requeue", "escalate"}, summary(rows)
        assert {r.cause for r in force.values()} == {"application"}, summary(rows)
        assert force["requeue"].exclude == [], summary(rows)
        assert "its owner should look" in force["escalate"].reason
        assert not [r for r in ledger.decisions(50) if r.action in ("drain", "stop")]
        running_again(lab_cfg, job, 1)
    finally:
        restore(lab_cfg)


# ---- 3. a burst ----------------------------------------------------------------------------


@pytest.fixture
def three_jobs(lab_cfg: LabConfig, submit: Callable[..., int]) -> Iterator[list[int]]:
    """Three 2-node jobs on the six train nodes, both leaf switches."""
    # An NCCL timeout of a minute: Slurm notices a dead slurmd (SlurmdTimeout 10 s here) before
    # the surviving ranks give up, as it does with PyTorch's 10 minutes at a site.
    jobs = [submit(nodes=2, nccl_timeout=60.0) for _ in range(3)]
    for job in jobs:
        running_nodes(lab_cfg, job)
        mapped(lab_cfg, job)
    yield jobs


def test_a_burst_across_leaves_and_jobs_drains_nothing_and_escalates_once(
    lab_cfg: LabConfig, three_jobs: list[int], tmp_path: Path
) -> None:
    # The lab tests' policy keeps bursts out of the other tests; this one has the defaults.
    ledger = serve_slurmedic(
        lab_cfg, tmp_path, "enforce", shared_cause={"burst_wait": monitoring.LAB_BURST_WAIT}
    )
    try:
        placed = {job: running_nodes(lab_cfg, job) for job in three_jobs}
        for job in three_jobs:
            sees_job(lab_cfg, job)
        leaves = {s.name: set(hostlist.expand_hostlist(s.nodes)) for s in lab_cfg.switches}
        # One node of each job, on both leaf switches.
        victims = [placed[job][-1] for job in three_jobs]
        assert {leaf for n in victims for leaf, members in leaves.items() if n in members} == set(
            leaves
        ), (placed, leaves)
        for node in victims:
            manage.kill_node(lab_cfg, node)
        told = eventually(
            lambda: [r for r in ledger.decisions(200) if r.action == "escalate"],
            timeout=90,
            what="the burst escalated",
        )
        assert len(told) == 1, summary(ledger.decisions(200))
        assert told[0].cause == "shared_infrastructure"
        assert set(victims) <= set(told[0].nodes), summary(told)
        # Slurm ends the jobs NODE_FAIL and requeues them itself.
        for job in three_jobs:
            eventually(
                lambda job=job: int(manage.show_job(lab_cfg, job)["Restarts"]) >= 1,
                timeout=90,
                what=f"Slurm requeued job {job} itself",
            )
        # slurmedic had time to decide everything it saw (its loop, well past the settle).
        loop_looked_after(ledger, time.time() + 10, what="slurmedic's loop after the requeues")
        rows = ledger.decisions(200)
        acted = [r for r in rows if r.action in ("drain", "requeue", "stop", "resume")]
        assert not acted, summary(rows)
        assert [r.action for r in rows if r.action == "escalate"] == ["escalate"], summary(rows)
        # Every other incident (a job's, or a node's once Slurm had requeued its job) says a
        # person was told of the storm.
        others = [r for r in rows if r.action != "escalate"]
        assert others and {(r.action, r.guard) for r in others} == {("none", "storm_escalated")}, (
            summary(rows)
        )
        for node in victims:
            assert not reason_of(lab_cfg, node).startswith("slurmedic:"), reason_of(lab_cfg, node)
    finally:
        restore(lab_cfg)
