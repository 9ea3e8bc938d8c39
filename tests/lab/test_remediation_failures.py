"""Enforce mode on the lab's real Slurm for the failures that leave no GPU evidence: a node that
stops answering (its slurmd killed with everything it runs), an NCCL hang where one node stays
silent; and the executor riding out a Slurm controller that is briefly away."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests

from lab import api, manage, monitoring, processes
from lab.config import LabConfig
from lab.faults import JobFault, add_job_fault, control_path
from lab.slurm import slurm, start_slurmctld
from tests.lab.conftest import PLAYBOOK_RUN_S, eventually, query, running_nodes, serve_slurmedic
from tests.lab.test_remediation import (
    checkpointed_job,
    decided,
    expedited,
    failures,
    healthy_after,
    mapped,
    restore,
)
from webhook.core.decisions import Decision
from webhook.executor.dispatch import Dispatcher
from webhook.executor.runner import run_playbook
from webhook.ledger.schema import DecisionRow
from webhook.ledger.store import Ledger
from webhook.rules.render import RuleSource

pytestmark = pytest.mark.lab
__all__ = ["healthy_after"]  # the autouse fixture: each test leaves a healthy cluster


@pytest.fixture
def enforce(lab_cfg: LabConfig, tmp_path: Path) -> Iterator[Ledger]:
    yield serve_slurmedic(lab_cfg, tmp_path, "enforce")
    restore(lab_cfg)


def resumed_without(cfg: LabConfig, job: int, bad: str) -> list[str]:
    def running_again() -> list[str]:
        info = manage.show_job(cfg, job)
        if info["JobState"] == "RUNNING" and int(info["Restarts"]) >= 1:
            return running_nodes(cfg, job)
        return []

    try:
        nodes: list[str] = eventually(
            running_again, timeout=PLAYBOOK_RUN_S, what="the job running again"
        )
    except AssertionError as e:
        job_info = slurm(cfg, "scontrol", "show", "job", str(job), "-o")
        raise AssertionError(f"{e}\n{job_info}\n{slurm(cfg, 'sinfo', '-N', '-l')}") from None
    assert bad not in nodes
    return nodes


def stays_drained(cfg: LabConfig, bad: str) -> None:
    """With its slurmd back, the node stays out of service until a human resumes it."""
    manage.clear(cfg, bad)
    eventually(
        lambda: (
            "DRAIN" in (info := slurm(cfg, "scontrol", "show", "node", bad, "-o"))
            and "NOT_RESPONDING" not in info
        ),
        what="the node answering again, still drained",
    )


def killed_and_decided(
    cfg: LabConfig, enforce: Ledger, submit: Callable[..., int], rank: int
) -> tuple[int, str, dict[str, DecisionRow]]:
    """A 3-node job whose node `rank` dies: slurmedic drains that node and requeues the job, or
    leaves it to Slurm's own requeue when Slurm was first (NODE_FAIL of a --requeue job: the lab's
    Slurm notices a dead slurmd within seconds, as soon as slurmedic's burst hold ends)."""
    job = submit(nodes=3)
    nodes = running_nodes(cfg, job)
    mapped(cfg, job)
    bad = nodes[rank]
    manage.kill_node(cfg, bad)
    rows = decided(cfg, enforce, f"{job}.0", 2, {"executed", "failed", "recorded"})
    got = {a: (r.state, r.cause) for a, r in rows.items()}
    requeued = {"drain": ("executed", "node_failure"), "requeue": ("executed", "node_failure")}
    left = {"drain": ("executed", "node_failure"), "none": ("recorded", "node_failure")}
    assert got in (requeued, left), failures(enforce, rows)
    if "none" in rows:
        assert "was requeued without slurmedic" in rows["none"].reason, rows["none"].reason
    assert rows["drain"].nodes == [bad]
    return job, bad, rows


def test_a_node_that_stops_answering_is_drained_and_the_job_requeued_without_it(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job, bad, rows = killed_and_decided(lab_cfg, enforce, submit, rank=2)
    info = slurm(lab_cfg, "scontrol", "show", "node", bad, "-o")
    assert "DRAIN" in info and f"Reason=slurmedic: {job}.0 node_failure" in info
    resumed_without(lab_cfg, job, bad)
    if "requeue" in rows:
        assert rows["requeue"].exclude == [bad]
        # Slurm may have requeued the job itself (NODE_FAIL of a --requeue job) while
        # slurmedic's requeue ran: the exclusion is there, or Slurm's successor had started
        # before it could apply, and the requeue's record says where it runs (clear of the node).
        excluded = bad in manage.show_job(lab_cfg, job)["ExcNodeList"].split(",")
        found = enforce.decision(rows["requeue"].id)
        assert found is not None
        run = [e.detail["run"] for e in found[1] if "run" in e.detail][-1]
        assert excluded or ("successor_nodes" in run and bad not in run["successor_nodes"]), run
    stays_drained(lab_cfg, bad)


def test_a_job_slurm_requeues_itself_when_its_node_dies_is_requeued_once(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    """Slurm's expedited requeue (`--requeue=expedite`, 25.11 and later): when a node of the job
    dies, Slurm requeues the job itself, first in line (EXPEDITING), and it runs again
    elsewhere within seconds. slurmedic drains the dead node and never requeues the job a
    second time: one restart, not two."""
    expedited(lab_cfg)
    job = submit(nodes=3, expedite=True)
    nodes = running_nodes(lab_cfg, job)
    mapped(lab_cfg, job)
    bad = nodes[2]
    manage.kill_node(lab_cfg, bad)
    rows = decided(lab_cfg, enforce, f"{job}.0", 2, {"executed", "failed", "recorded"})
    assert rows["drain"].state == "executed" and rows["drain"].nodes == [bad], failures(
        enforce, rows
    )
    # Its requeue found Slurm's own under way (the exclusion added to the waiting successor,
    # nothing requeued), or came after the successor had started (left alone).
    assert ("requeue" in rows and rows["requeue"].state == "executed") or (
        "none" in rows and "was requeued without slurmedic" in rows["none"].reason
    ), failures(enforce, rows)
    if "requeue" in rows:
        _, events = enforce.decision(rows["requeue"].id)  # type: ignore[misc]
        ran = next(e.detail["run"]["commands"] for e in events if "run" in e.detail)
        assert not any("requeuehold" in c for c in ran), ran
    resumed_without(lab_cfg, job, bad)
    assert manage.show_job(lab_cfg, job)["Restarts"] == "1"
    stays_drained(lab_cfg, bad)


@pytest.fixture
def no_slurm_exporter(lab_cfg: LabConfig) -> Iterator[None]:
    """The lab as a site without a Slurm exporter: its rules read node states from slurmedic's
    own /metrics (`slurmedic-nodes` profile), and the exporter is stopped. Requested before
    `enforce`, it is undone after slurmedic stops: the exporter's return must not raise alerts
    for a slurmedic still acting (it drained a node the next test needed)."""
    rules = lab_cfg.run_dir / "rules"
    profile = monitoring.rules_profile(lab_cfg)
    RuleSource().write(rules, profile=f"{profile},slurmedic-nodes")
    requests.post(f"{lab_cfg.prometheus_url}/-/reload", timeout=10).raise_for_status()
    assert processes.stop(lab_cfg, "slurm-exporter")
    try:
        yield
    finally:
        RuleSource().write(rules, profile=profile)
        requests.post(f"{lab_cfg.prometheus_url}/-/reload", timeout=10).raise_for_status()
        monitoring.start(lab_cfg)
        monitoring.wait_ready(lab_cfg)


def test_without_a_slurm_exporter_slurmedic_s_node_states_raise_the_node_alert(
    lab_cfg: LabConfig, no_slurm_exporter: None, enforce: Ledger, submit: Callable[..., int]
) -> None:
    """SlurmNodeDown from slurmedic_node_status: the node states slurmedic's cluster view holds,
    published on its /metrics, are enough for a dead node to be drained and its job requeued."""
    eventually(
        lambda: len(query(lab_cfg, 'slurmedic_node_status{job="slurmedic"}')) >= 8,
        what="slurmedic's node states in Prometheus",
    )
    # The exporter's series are gone (stale after the first scrape that fails).
    eventually(lambda: not query(lab_cfg, "slurm_node_status"), what="no exporter series")
    # Rank 0's node, not the next test's silent rank 1: a dead node's alert outlives this test,
    # and the next test's slurmedic catches it up from the lab's ledger and drains it again.
    job, bad, rows = killed_and_decided(lab_cfg, enforce, submit, rank=0)
    assert "SlurmNodeDown" in {e["alertname"] for e in rows["drain"].evidence}
    # slurmedic reports it as not responding (drained by now: `drained*` or `draining*`).
    assert query(lab_cfg, f'slurmedic_node_status{{node="{bad}",status=~".+[*]"}}')
    resumed_without(lab_cfg, job, bad)
    stays_drained(lab_cfg, bad)


def test_the_silent_node_of_an_nccl_hang_is_drained_and_the_job_requeued(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job, nodes = checkpointed_job(lab_cfg, submit)
    manage.inject_job(lab_cfg, "hang", job, 1)
    rows = decided(lab_cfg, enforce, f"{job}.0", 2, {"executed", "failed"})
    assert {a: (r.state, r.cause) for a, r in rows.items()} == {
        "drain": ("executed", "node_failure"),
        "requeue": ("executed", "node_failure"),
    }, failures(enforce, rows)
    assert rows["drain"].nodes == [nodes[1]]
    resumed_without(lab_cfg, job, nodes[1])
    eventually(
        lambda: (
            (r := query(lab_cfg, f'min(training_step{{slurm_job_id="{job}"}})'))
            and r[0]["value"] > 5
        ),
        what="progress after the requeue",
    )


@pytest.mark.one_stack
def test_a_successor_that_crashes_before_its_first_checkpoint_is_a_failed_recovery(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job, nodes = checkpointed_job(lab_cfg, submit)
    # The successor (attempt 1) will crash as soon as it starts.
    add_job_fault(
        control_path(lab_cfg.jobs, job),
        JobFault(rank=0, attempt=1, kind="crash_cuda", at=time.time()),
    )
    manage.inject_gpu(lab_cfg, "xid", nodes[0], 1, xid=79)
    rows = decided(lab_cfg, enforce, f"{job}.0", 2, {"executed", "failed"})
    assert rows["requeue"].state == "executed", failures(enforce, rows)
    recovery = eventually(
        lambda: [r for r in enforce.recoveries("recovered", "failed") if r.incident == f"{job}.0"],
        timeout=PLAYBOOK_RUN_S,
        what="the recovery judged",
    )[0]
    assert recovery.state == "failed", (recovery.reason, recovery.failed_step)
    assert recovery.before_checkpoint, recovery.reason
    escalated = eventually(
        lambda: [
            r
            for r in enforce.incident_decisions(f"verify:{job}.0")
            if r.action == "escalate" and r.guard == "recovery_failed"
        ],
        what="the failed recovery escalated",
    )[0]
    assert "did not recover" in escalated.reason
    eventually(
        lambda: query(lab_cfg, 'slurmedic_recoveries_total{outcome="failed"} >= 1'),
        what="the failed recovery in /metrics",
    )
    # People hear of it through the site's Alertmanager, with a link to the console page, until
    # someone records a verdict on it.
    notice = {"alertname": "SlurmedicRecoveryFailed", "incident": f"verify:{job}.0"}
    (posted,) = eventually(lambda: api.alerts(lab_cfg, **notice), what="the notice in Alertmanager")
    assert posted["labels"]["notice"] == "slurmedic" and "signal" not in posted["labels"]
    assert posted["annotations"]["console"].endswith(f"/console/incident/verify:{job}.0")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "verdict",
            str(escalated.id),
            "agree",
            f"--config={lab_cfg.slurmedic_config}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    eventually(lambda: not api.alerts(lab_cfg, **notice), what="the notice resolved")
    # The successor's own failure, one rank's CUDA error while the others timed out, is requeued
    # once with its owner told (waited for: the test must not end while that requeue runs).
    again = decided(lab_cfg, enforce, f"{job}.1", 2, {"executed", "failed"})
    assert {a: (r.state, r.cause) for a, r in again.items()} == {
        "requeue": ("executed", "application"),
        "escalate": ("executed", "application"),
    }, failures(enforce, again)
    eventually(
        lambda: (
            manage.show_job(lab_cfg, job)["JobState"] == "RUNNING"
            and int(manage.show_job(lab_cfg, job)["Restarts"]) >= 2
        ),
        timeout=PLAYBOOK_RUN_S,
        what="attempt 2 running",
    )


def test_a_drain_rides_out_a_controller_that_is_briefly_away(
    lab_cfg: LabConfig, tmp_path: Path
) -> None:
    """The executor retries what Slurm's controller answers while it restarts ("Unable to
    contact slurm controller"), and the drain lands once the controller is back."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    node = "gpu08"
    at = datetime.now(UTC)
    (row_id,) = ledger.record(
        [
            Decision(
                at=at,
                incident=f"node:{node}",
                job=None,
                action="drain",
                cause="gpu_hardware",
                reason="test",
                nodes=(node,),
                mode="enforce",
                state="pending",
            )
        ]
    )
    dispatcher = Dispatcher(
        ledger,
        slurm_env=lab_cfg.slurm_env(),
        inventory=lab_cfg.etc / "inventory.yml",
        retries=6,
        backoff=1.0,
        timeout=60,
    )
    assert processes.stop(lab_cfg, "slurmctld")
    # The controller comes back once the executor has met it away and decided to retry (its
    # log says so), not after a guessed time: the retry must bridge the outage.
    retrying = threading.Event()

    class Retries(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "transient Slurm error" in record.getMessage():
                retrying.set()

    def restart() -> None:
        retrying.wait(120)
        start_slurmctld(lab_cfg)

    handler = Retries()
    logging.getLogger("slurmedic.executor").addHandler(handler)
    restarted = threading.Thread(target=restart)
    restarted.start()
    try:
        dispatcher.dispatch(ledger.rows([row_id]))
        dispatcher.close()
    finally:
        retrying.set()
        restarted.join()
        logging.getLogger("slurmedic.executor").removeHandler(handler)
    row, events = ledger.decision(row_id)  # type: ignore[misc]
    assert row.state == "executed", [e.detail for e in events]
    run = events[-1].detail["run"]
    assert run["attempts"][0] == "transient Slurm error" and run["attempts"][-1] == "successful"
    assert "DRAIN" in slurm(lab_cfg, "scontrol", "show", "node", node, "-o")
    # Resumable once its slurmd has registered with the restarted controller.
    eventually(
        lambda: (
            "NOT_RESPONDING" not in (info := slurm(lab_cfg, "scontrol", "show", "node", node, "-o"))
            and "UNKNOWN" not in info
        ),
        what="the node registered again",
    )
    slurm(lab_cfg, "scontrol", "update", f"nodename={node}", "state=resume")


def test_the_requeue_playbook_refuses_a_job_cancelled_since_the_decision(
    lab_cfg: LabConfig, submit: Callable[..., int]
) -> None:
    """A decision carried out after its job was cancelled (approve mode: a human approved it
    later) does not bring the job back: the playbook reads the job first and refuses."""
    job = submit(nodes=2)
    nodes = running_nodes(lab_cfg, job)
    slurm(lab_cfg, "scancel", str(job))
    eventually(lambda: manage.show_job(lab_cfg, job)["JobState"] == "CANCELLED", what="cancelled")
    result = run_playbook(
        "requeue_job",
        {
            "slurmedic_job": job,
            "slurmedic_attempt": 0,
            "slurmedic_exclude": [nodes[0]],
            "slurmedic_slurm_env": lab_cfg.slurm_env(),
        },
        check=False,
        inventory=lab_cfg.etc / "inventory.yml",
    )
    assert not result.ok, result.output
    assert "never requeues a job that was cancelled" in result.output, result.output
    info = manage.show_job(lab_cfg, job)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0")


def test_a_requeue_readmits_what_an_earlier_one_excluded_and_keeps_the_owner_s_exclusion(
    lab_cfg: LabConfig, submit: Callable[..., int]
) -> None:
    """Slurm keeps a job's ExcNodeList for every attempt. A requeue takes out the nodes an
    earlier requeue excluded that are in service again (`slurmedic_readmit`), adds its own, and
    leaves the owner's `--exclude` alone (the playbook knows no owner: slurmedic readmits only
    nodes its own requeues excluded); readmitting all of them clears the list."""
    owner = lab_cfg.nodes[-1]
    job = submit(nodes=2, exclude=owner)
    first = running_nodes(lab_cfg, job)

    def requeue(attempt: int, exclude: list[str], readmit: list[str]) -> list[str]:
        result = run_playbook(
            "requeue_job",
            {
                "slurmedic_job": job,
                "slurmedic_attempt": attempt,
                "slurmedic_exclude": exclude,
                "slurmedic_readmit": readmit,
                "slurmedic_slurm_env": lab_cfg.slurm_env(),
            },
            check=False,
            inventory=lab_cfg.etc / "inventory.yml",
        )
        assert result.ok, result.output
        eventually(
            lambda: int(manage.show_job(lab_cfg, job)["Restarts"]) == attempt + 1,
            what=f"attempt {attempt + 1}",
        )
        shown = manage.show_job(lab_cfg, job)["ExcNodeList"]
        if shown == "(null)":
            return []
        return slurm(lab_cfg, "scontrol", "show", "hostnames", shown).split()

    assert sorted(requeue(0, [first[0]], [])) == sorted([owner, first[0]])
    second = running_nodes(lab_cfg, job)
    assert first[0] not in second and owner not in second
    assert sorted(requeue(1, [second[0]], [first[0]])) == sorted([owner, second[0]])
    running_nodes(lab_cfg, job)
    assert requeue(2, [], [second[0]]) == [owner]
    # Readmitting every node clears the list (`ExcNodeList=`), as for a job with no --exclude.
    running_nodes(lab_cfg, job)
    assert requeue(3, [], [owner]) == []
