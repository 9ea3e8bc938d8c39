"""Remediation on the lab's real Slurm: enforce mode carries decisions out; approve mode waits.

slurmedic runs with an enforce policy: an XID 79 drains the node with slurmedic's reason and
requeues the job away from it, and the successor resumes from its checkpoint; an application
crash stops the job and drains nothing. Then approve mode: nothing changes until a human
approves; a rejection changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from lab import api, manage, monitoring, processes, stacks
from lab.config import LabConfig
from lab.faults import SpoilKind
from lab.slurm import node_states, slurm
from tests.lab.conftest import (
    PLAYBOOK_RUN_S,
    eventually,
    joblog,
    next_attempt,
    query,
    running_nodes,
    serve_slurmedic,
    slurmedic_story,
)
from webhook.core.lifecycle import AWAITING_APPROVAL, SUPERSEDED
from webhook.ledger.schema import DecisionRow, RecoveryRow
from webhook.ledger.store import Ledger
from webhook.rules import dashboards

pytestmark = pytest.mark.lab


def heal(cfg: LabConfig) -> None:
    """Healthy GPUs, every slurmd back and answering, and no drained node: a node killed by a
    test answers again before it can be resumed (resuming one that does not answer fails)."""
    manage.clear(cfg)
    eventually(
        lambda: not any(s.endswith("*") for s in node_states(cfg).values()),
        timeout=60,
        what="every node answering",
    )
    for node, state in node_states(cfg).items():
        if state.startswith("drain"):
            slurm(cfg, "scontrol", "update", f"nodename={node}", "state=resume", check=False)
    eventually(
        lambda: not any(s.startswith("drain") for s in node_states(cfg).values()),
        what="no drained node",
    )


def restore(cfg: LabConfig) -> None:
    """Give the next tests a healthy cluster: resume what this module drained."""
    processes.stop(cfg, "slurmedic")
    heal(cfg)


@pytest.fixture(autouse=True)
def healthy_after(lab_cfg: LabConfig) -> Iterator[None]:
    """Each test leaves healthy GPUs and no drained node behind: faults from one test would
    otherwise be real evidence (and real drains) in the next."""
    yield
    heal(lab_cfg)


@pytest.fixture(scope="module")
def enforce(lab_cfg: LabConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    yield serve_slurmedic(lab_cfg, tmp_path_factory.mktemp("enforce"), "enforce")
    restore(lab_cfg)


def decided(
    cfg: LabConfig, ledger: Ledger, incident: str, n: int, states: set[str]
) -> dict[str, DecisionRow]:
    """The decisions in force for `incident` (the latest per action; one that later evidence
    superseded before it ran is not in force), once there are `n` and all are in `states`;
    on a timeout, the story of what slurmedic saw and did (slurmedic_story)."""

    def done() -> dict[str, DecisionRow]:
        # In id order: a later row of an action replaces an earlier one.
        rows = {r.action: r for r in ledger.incident_decisions(incident) if r.state != SUPERSEDED}
        return rows if len(rows) == n and all(r.state in states for r in rows.values()) else {}

    try:
        # A drain's and a requeue's playbook runs took 38 s and 60 s at load 24 (26.05 beside
        # another lab): the deadline only bounds a hang.
        return eventually(done, timeout=180, what=f"{n} decision(s) of {incident} in {states}")
    except AssertionError as e:
        job = int(incident.split(".")[0])
        raise AssertionError(f"{e}\n{slurmedic_story(cfg, ledger, job)}") from None


def failures(ledger: Ledger, rows: dict[str, DecisionRow]) -> str:
    """What the ledger holds of every run that failed: an assertion's message, so a lab failure
    in CI says why without its ledger."""
    lines = []
    for row in rows.values():
        if row.state != "failed" or (found := ledger.decision(row.id)) is None:
            continue
        for event in found[1]:
            lines.append(f"{row.action} #{row.id} {event.state} at {event.at}: {event.detail}")
    return "\n".join(lines)


def mapped(cfg: LabConfig, job: int) -> None:
    eventually(
        lambda: query(cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}'), what="job mapped"
    )


def checkpointed_job(
    cfg: LabConfig, submit: Callable[..., int], **kw: object
) -> tuple[int, list[str]]:
    """A training job on 3 nodes, its GPUs mapped in Prometheus, past its first checkpoint."""
    job = submit(nodes=3, **kw)
    nodes = running_nodes(cfg, job)
    mapped(cfg, job)
    ckpt = f'min(training_last_checkpoint_step{{slurm_job_id="{job}"}})'
    eventually(lambda: (r := query(cfg, ckpt)) and r[0]["value"] >= 5, what="a checkpoint")
    return job, nodes


def xid_79_under_a_seen_job(cfg: LabConfig, submit: Callable[..., int]) -> tuple[int, str]:
    """A checkpointed training job, an XID 79 on its second node once slurmedic sees the job:
    (job, that node). slurmedic's own view must have the job too (its loop polls Slurm every
    few seconds): an XID before that, without dcgm-exporter's job label yet, is an idle node's
    failure, drained in an incident of its own (CI saw it once, with slurmedic started a second
    before)."""
    job, nodes = checkpointed_job(cfg, submit)
    eventually(
        lambda: query(cfg, f'slurmedic_job_eligible{{slurm_job_id="{job}"}} == 1'),
        what="slurmedic sees the job",
    )
    manage.inject_gpu(cfg, "xid", nodes[1], 4, xid=79)
    return job, nodes[1]


def test_enforce_drains_requeues_and_the_job_resumes_elsewhere(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job, bad = xid_79_under_a_seen_job(lab_cfg, submit)
    rows = decided(lab_cfg, enforce, f"{job}.0", 2, {"executed", "failed"})
    assert {a: r.state for a, r in rows.items()} == {
        "drain": "executed",
        "requeue": "executed",
    }, failures(enforce, rows)
    # The node is drained with slurmedic's reason ...
    info = slurm(lab_cfg, "scontrol", "show", "node", bad, "-o")
    assert "DRAIN" in info and f"Reason=slurmedic: {job}.0 gpu_hardware" in info
    # ... the job runs again, without it, and resumes from its checkpoint.
    new = next_attempt(lab_cfg, job)
    assert bad not in new
    line = eventually(
        lambda: [
            ln
            for ln in joblog(lab_cfg, job, new[0], 0).read_text().splitlines()
            if "attempt 1" in ln
        ],
        what="rank 0 restarted",
    )[0]
    resumed = int(line.rsplit(" ", 1)[1])
    assert "resuming from checkpoint" in line and resumed >= 5
    eventually(
        lambda: (
            (r := query(lab_cfg, f'min(training_step{{slurm_job_id="{job}"}})'))
            and r[0]["value"] > resumed
        ),
        what="progress past the checkpoint",
    )
    # slurmedic saw it too: the recovery is verified, with the time to restore training.
    recovery = eventually(
        lambda: [r for r in enforce.recoveries("recovered") if r.incident == f"{job}.0"],
        timeout=60,
        what="recovery verified",
    )[0]
    assert recovery.failed_step is not None and recovery.failed_step >= 5
    assert recovery.restored_seconds is not None and recovery.restored_seconds > 0
    # ... with how it resumed: from the last complete checkpoint, its loss going on falling.
    # (A checkpoint may be written between slurmedic's read and the requeue: never older.)
    assert recovery.checkpoint_step is not None and recovery.resume_step == resumed
    assert resumed >= recovery.checkpoint_step, recovery.reason
    assert recovery.lost_steps == max(recovery.failed_step - resumed, 0)
    assert recovery.quality_before is not None and recovery.quality_after is not None
    assert recovery.quality_after <= recovery.quality_before
    eventually(
        lambda: (
            query(lab_cfg, 'slurmedic_recoveries_total{outcome="recovered"} >= 1')
            and query(lab_cfg, "slurmedic_time_to_restore_seconds_count >= 1")
        ),
        what="the recovery in slurmedic's /metrics, scraped by Prometheus",
    )
    # What ran is in the ledger, command by command.
    _, events = enforce.decision(rows["requeue"].id)  # type: ignore[misc]
    ran = next(e.detail["run"]["commands"] for e in events if "run" in e.detail)
    assert ran == [
        f"scontrol requeuehold {job}",
        f"scontrol update jobid={job} ExcNodeList={bad}",
        f"scontrol release {job}",
    ]
    assert [e.state for e in events] == ["pending", "running", "executed"]
    # Diagnostics of the drained node, kept after the requeue: its nvidia-smi lost a GPU. A
    # playbook run of its own, after the requeue's (26 s and 36 s later at load 10 on 2 CPUs).
    diag = eventually(
        lambda: next(
            (
                e.detail["diagnostics"]
                for e in enforce.decision(rows["drain"].id)[1]  # type: ignore[index]
                if "diagnostics" in e.detail
            ),
            None,
        ),
        timeout=PLAYBOOK_RUN_S,
        what="diagnostics recorded",
    )
    assert diag is not None
    node = diag["nodes"][bad]
    assert node["verdict"] == "unhealthy", node
    assert "nvidia-smi shows 7 of 8 GPUs" in node["problems"]
    folder = Path(node["artifacts"])
    assert (folder / "nvidia-smi.xml").is_file() and (folder / "summary.txt").is_file()
    assert "slurmd" in (folder / "slurmd.log").read_text()


def spoiled_recovery(
    cfg: LabConfig, ledger: Ledger, submit: Callable[..., int], kind: SpoilKind
) -> RecoveryRow:
    """An XID 79 under a job whose next attempt resumes from a spoiled checkpoint; the
    recovery once judged."""
    job, nodes = checkpointed_job(cfg, submit)
    # Far enough into training that its loss is well below where it began.
    ckpt = f'min(training_last_checkpoint_step{{slurm_job_id="{job}"}})'
    eventually(lambda: (r := query(cfg, ckpt)) and r[0]["value"] >= 40, what="8 checkpoints")
    manage.spoil_checkpoint(cfg, job, kind)
    eventually(
        lambda: query(cfg, f'slurmedic_job_eligible{{slurm_job_id="{job}"}} == 1'),
        what="slurmedic sees the job",
    )
    manage.inject_gpu(cfg, "xid", nodes[1], 4, xid=79)
    try:
        judged = eventually(
            lambda: [
                r for r in ledger.recoveries() if r.incident == f"{job}.0" and r.state != "watching"
            ],
            timeout=150,
            what=f"the recovery of {job}.0 judged",
        )[0]
    except AssertionError as e:
        raise AssertionError(f"{e}\n{slurmedic_story(cfg, ledger, job)}") from None
    # The node drained, the job requeued (an escalation beside them when the node failed in
    # an earlier test too: a repeat).
    ran = {r.action: r.state for r in ledger.incident_decisions(f"{job}.0")}
    assert (ran["drain"], ran["requeue"]) == ("executed", "executed"), ran
    return judged


@pytest.mark.one_stack
def test_a_resume_from_an_older_checkpoint_is_recovered_with_the_work_it_lost(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    r = spoiled_recovery(lab_cfg, enforce, submit, "old")
    assert r.state == "recovered", r.reason
    assert r.checkpoint_step is not None and r.failed_step is not None
    # A checkpoint older than the last it wrote before the fault: more lost than a sound resume.
    assert r.resume_step is not None and r.resume_step < r.checkpoint_step, r.reason
    assert r.lost_steps == r.failed_step - r.resume_step
    assert r.lost_seconds is not None and r.lost_seconds > 0
    assert r.start_seconds is not None and r.start_seconds >= 0
    assert (
        f"resumed from step {r.resume_step:g} (last checkpoint {r.checkpoint_step:g})" in r.reason
    )


def drill(cfg: LabConfig, ledger: Ledger, job: int, *args: str) -> dict[str, Any]:
    """`slurmedic drill JOB ... --wait`, then the drill as `slurmedic drills --json` shows it."""
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "drill",
            str(job),
            *args,
            "--wait=180",
            f"--config={cfg.slurmedic_config}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    listed = cli(cfg, "drills", "--json")
    assert listed.returncode == 0, listed.stderr
    found: dict[str, Any]
    (found,) = [d for d in json.loads(listed.stdout) if d["job"] == job]
    found["exit"], found["said"] = ran.returncode, ran.stdout + ran.stderr
    found["story"] = slurmedic_story(cfg, ledger, job)
    return found


def test_a_drill_interrupts_a_job_and_passes_when_it_resumes_from_its_last_checkpoint(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job, nodes = checkpointed_job(lab_cfg, submit)
    eventually(
        lambda: query(lab_cfg, f'slurmedic_job_eligible{{slurm_job_id="{job}"}} == 1'),
        what="slurmedic sees the job",
    )
    real = len(enforce.figures().recoveries)
    d = drill(lab_cfg, enforce, job, "--exclude", nodes[2])
    assert (d["exit"], d["outcome"]) == (0, "passed"), d
    assert "passed" in d["said"]
    # Resumed from its last checkpoint (or a later one: one may be written meanwhile), with
    # what the interruption cost.
    assert d["resumed_from_step"] >= d["last_checkpoint_step"] > 0, d
    assert d["lost_steps"] is not None and d["start_seconds"] is not None, d
    assert d["quality_after"] <= d["quality_before"], d
    # The node it excluded was not drained: a drill takes nothing out of service.
    assert nodes[2] not in next_attempt(lab_cfg, job)
    assert "drain" not in node_states(lab_cfg)[nodes[2]]
    # Apart from real recoveries, in the ledger's figures and in /metrics.
    assert len(enforce.figures().recoveries) == real
    eventually(
        lambda: query(lab_cfg, 'slurmedic_drills{outcome="passed"} >= 1'),
        what="the drill in slurmedic's /metrics",
    )


@pytest.mark.one_stack
def test_a_drill_fails_when_the_job_resumes_from_a_corrupt_checkpoint(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job, _ = checkpointed_job(lab_cfg, submit)
    ckpt = f'min(training_last_checkpoint_step{{slurm_job_id="{job}"}})'
    eventually(lambda: (r := query(lab_cfg, ckpt)) and r[0]["value"] >= 40, what="8 checkpoints")
    manage.spoil_checkpoint(lab_cfg, job, "corrupt")
    d = drill(lab_cfg, enforce, job)
    assert (d["exit"], d["outcome"]) == (1, "failed"), d
    assert "its output is not usable" in d["reason"], d
    # Handed to a human, and nothing else done to the job.
    (escalation,) = [
        r for r in enforce.incident_decisions(f"verify:{job}.0") if r.action == "escalate"
    ]
    assert escalation.guard == "drill_failed" and escalation.cause == "drill"


def test_a_job_that_stops_checkpointing_is_warned_about_and_one_on_schedule_is_not(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    stale, steady = submit(nodes=1), submit(nodes=1)
    for job in (stale, steady):
        mapped(lab_cfg, job)
        learnt = f'slurmedic:job_checkpoint_interval_seconds{{slurm_job_id="{job}"}}'
        eventually(partial(query, lab_cfg, learnt), what=f"job {job}'s checkpoint interval")
    manage.inject_job(lab_cfg, "skip_checkpoints", stale, 0)
    firing = 'ALERTS{{alertname="TrainingCheckpointStale",alertstate="firing",slurm_job_id="{}"}}'
    (alert,) = eventually(
        lambda: query(lab_cfg, firing.format(stale)),
        timeout=120,
        what="TrainingCheckpointStale firing for the job that stopped checkpointing",
    )
    assert alert["labels"]["severity"] == "warning" and "signal" not in alert["labels"]
    # The job on its schedule never fired, over the whole test; slurmedic acted on neither.
    assert not query(lab_cfg, f"last_over_time({firing.format(steady)}[10m])")
    assert not [d for d in enforce.decisions(200) if d.job in (stale, steady)]


def test_every_dashboard_query_answers_after_a_recovery(
    lab_cfg: LabConfig, enforce: Ledger
) -> None:
    """Right after the verified recovery above: every query of the three dashboards runs on the
    lab's Prometheus without error, and the goodput and recovery panels show data."""
    recovered = enforce.recoveries("recovered")
    assert recovered, "the test above leaves a verified recovery"
    job, bad = recovered[-1].job, None
    for r in enforce.incident_decisions(recovered[-1].incident):
        bad = r.nodes[0] if r.action == "drain" else bad
    values = {
        "slurm_job_id": str(job),
        "node": bad or "gpu01",
        "window": "10m",
        "__rate_interval": "10s",
        "__range": "10m",
    }
    # GPU health may be quiet (no XID now, no ECC errors): only the goodput and recovery
    # panels must show the run. Recording rules lag a scrape and an evaluation: poll a while.
    must = [
        q
        for path in dashboards.dashboards()
        for q in dashboards.queries(path, values)
        if q.dashboard != "slurmedic-gpu-health"
    ]
    everything = [q for path in dashboards.dashboards() for q in dashboards.queries(path, values)]
    for q in everything:
        api.query(lab_cfg, q.expr)  # raises with Prometheus's error if a query is invalid

    # As a panel over the last 10 minutes shows it (a range, as Grafana asks): the recovered
    # job has ended since (the test above cancelled it), so its series may already be stale
    # at this instant, while the dashboard still shows its run.
    def empty() -> list[str]:
        return [
            f"{q.dashboard} {q.title!r}: {q.expr}"
            for q in must
            if not api.query(lab_cfg, f"count_over_time(({q.expr})[10m:1s])")
        ]

    try:
        eventually(lambda: not empty(), timeout=30, what="every goodput and recovery panel")
    except AssertionError:
        raise AssertionError("panels without data:\n" + "\n".join(empty())) from None


def test_enforce_stops_an_application_failure_and_drains_nothing(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job = submit(nodes=2)
    running_nodes(lab_cfg, job)
    mapped(lab_cfg, job)
    drained_before = slurm(lab_cfg, "sinfo", "-h", "-t", "drain", "-o", "%N")
    # Every rank alike: the code's (one rank's crash is requeued once: test_decisions_at_scale).
    manage.inject_job(lab_cfg, "crash_cuda", job, 0, 1)
    rows = decided(lab_cfg, enforce, f"{job}.0", 1, {"executed", "failed"})
    assert list(rows) == ["stop"] and rows["stop"].state == "executed", failures(enforce, rows)
    assert slurm(lab_cfg, "sinfo", "-h", "-t", "drain", "-o", "%N") == drained_before
    state = manage.show_job(lab_cfg, job)["JobState"]
    assert state in ("CANCELLED", "FAILED"), state  # cancelled, or already failed on its own


def expedited(cfg: LabConfig) -> None:
    if not stacks.get(cfg.stack).expedited_requeue:
        pytest.skip(f"Slurm of the {cfg.stack} stack has no expedited requeue (25.11 and later)")


def drained_and_requeued(ledger: Ledger, incident: str) -> dict[str, DecisionRow]:
    """The incident's decisions once its drain and requeue have run (an escalation beside them
    when the node failed in an earlier test of the module too: a repeat)."""

    def done() -> dict[str, DecisionRow]:
        rows = {r.action: r for r in ledger.incident_decisions(incident) if r.state != SUPERSEDED}
        ran = all(
            a in rows and rows[a].state in ("executed", "failed") for a in ("drain", "requeue")
        )
        return rows if ran else {}

    return eventually(done, timeout=180, what=f"the drain and requeue of {incident} run")


def held(cfg: LabConfig, job: int) -> dict[str, str]:
    """The job once Slurm has requeued and held it after its run failed."""

    def found() -> dict[str, str]:
        info = manage.show_job(cfg, job)
        return info if info["JobState"] == "REQUEUE_HOLD" else {}

    return eventually(found, what=f"job {job} requeued and held by Slurm")


def test_a_job_slurm_holds_after_a_hardware_failure_is_released_away_from_the_node(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    """Slurm's expedited requeue (`--requeue=expedite`): the run that exits non-zero is requeued
    by Slurm itself and held. slurmedic does not requeue it again: it drains the node to blame
    and releases the held job with the node excluded."""
    expedited(lab_cfg)
    job, nodes = checkpointed_job(lab_cfg, submit, expedite=True)
    bad = nodes[1]
    manage.inject_job(lab_cfg, "crash_ecc", job, 1)
    info = held(lab_cfg, job)
    assert (info["Restarts"], info["ExpeditedRequeue"]) == ("1", "Yes"), info
    rows = drained_and_requeued(enforce, f"{job}.0")
    assert (rows["drain"].state, rows["requeue"].state) == ("executed", "executed"), failures(
        enforce, rows
    )
    _, events = enforce.decision(rows["requeue"].id)  # type: ignore[misc]
    ran = next(e.detail["run"]["commands"] for e in events if "run" in e.detail)
    assert ran == [f"scontrol update jobid={job} ExcNodeList={bad}", f"scontrol release {job}"]
    assert bad not in next_attempt(lab_cfg, job, 1)
    assert rows["requeue"].mismatch is None


def cli(cfg: LabConfig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args, f"--config={cfg.slurmedic_config}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.one_stack
def test_approve_mode_waits_for_a_human(
    lab_cfg: LabConfig,
    enforce: Ledger,
    submit: Callable[..., int],
    tmp_path: Path,
) -> None:
    ledger = serve_slurmedic(lab_cfg, tmp_path, "approve")
    job = submit(nodes=3)
    nodes = running_nodes(lab_cfg, job)
    mapped(lab_cfg, job)
    before = (
        slurm(lab_cfg, "sinfo", "-h", "-N", "-o", "%N %t"),
        manage.show_job(lab_cfg, job)["Restarts"],
    )
    manage.inject_gpu(lab_cfg, "xid", nodes[2], 1, xid=79)
    rows = decided(lab_cfg, ledger, f"{job}.0", 2, {"awaiting_approval"})
    # The approver reads the exact commands first: the dry runs, computed while they wait.
    drain = f'scontrol update nodename={nodes[2]} state=drain reason="slurmedic: {job}.0'
    # Each is a check-mode playbook run, one after the other within the incident: seconds each
    # on a quiet machine, more on a loaded one (the deadline only bounds a hang).
    listed = eventually(
        lambda: (out := cli(lab_cfg, "review").stdout).count("not recorded yet") == 0 and out,
        timeout=PLAYBOOK_RUN_S,
        what="both dry runs in review",
    )
    assert isinstance(listed, str)
    assert "waiting for approval" in listed and "XID 79" in listed
    assert drain in listed and f"scontrol requeuehold {job}" in listed, listed
    # Nothing moves without a human.
    assert (
        slurm(lab_cfg, "sinfo", "-h", "-N", "-o", "%N %t"),
        manage.show_job(lab_cfg, job)["Restarts"],
    ) == before
    out = cli(lab_cfg, "reject", str(rows["requeue"].id), "--reason", "we checkpoint first")
    assert out.returncode == 0, out.stderr
    out = cli(lab_cfg, "approve", str(rows["drain"].id))
    assert out.returncode == 0, out.stderr
    eventually(
        lambda: "DRAIN" in slurm(lab_cfg, "scontrol", "show", "node", nodes[2], "-o"),
        timeout=PLAYBOOK_RUN_S,
        what="approved drain carried out",
    )
    # The rejected requeue never ran: the job keeps its attempt.
    assert manage.show_job(lab_cfg, job)["Restarts"] == before[1]
    final = decided(lab_cfg, ledger, f"{job}.0", 2, {"executed", "rejected"})
    states = {a: r.state for a, r in final.items()}
    assert states == {"drain": "executed", "requeue": "rejected"}
    # Approving twice is refused, with a reason.
    again = cli(lab_cfg, "approve", str(rows["drain"].id))
    assert again.returncode == 1 and "not awaiting_approval" in again.stderr


@pytest.mark.one_stack
def test_an_escalation_in_approve_mode_reaches_people_without_an_approval(
    lab_cfg: LabConfig,
    enforce: Ledger,
    submit: Callable[..., int],
    tmp_path: Path,
) -> None:
    ledger = serve_slurmedic(lab_cfg, tmp_path, "approve")
    job = submit(nodes=2)
    nodes = running_nodes(lab_cfg, job)
    mapped(lab_cfg, job)
    incident = f"{job}.0"
    # An application XID on a job that keeps training: slurmedic leaves it alone and hands
    # the incident to a human. That changes nothing in Slurm, so nothing waits for approval.
    manage.inject_gpu(lab_cfg, "xid", nodes[1], 0, xid=13)
    rows = decided(lab_cfg, ledger, incident, 2, {"recorded", "executed"})
    assert (rows["escalate"].mode, rows["escalate"].state) == ("approve", "executed")
    assert rows["none"].guard == "job_running"
    escalation = {"alertname": "SlurmedicEscalation", "incident": incident}
    eventually(lambda: api.alerts(lab_cfg, **escalation), timeout=60, what="the escalation")
    assert not api.alerts(lab_cfg, alertname="SlurmedicAwaitingApproval", incident=incident)
    # Only this incident is asked about: an earlier test's alert still in Alertmanager's
    # retries may add a waiting drain of its own to the queue.
    assert not [r for r in ledger.in_state(AWAITING_APPROVAL) if r.incident == incident]
    queue = cli(lab_cfg, "review").stdout
    assert not [r for r in rows.values() if f"\n{r.id} {r.action}: would run" in queue]


@pytest.mark.one_stack
def test_the_global_switch_sends_enforce_back_to_dry_runs_at_once(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int], tmp_path: Path
) -> None:
    ledger = serve_slurmedic(lab_cfg, tmp_path, "enforce")
    assert cli(lab_cfg, "switch", "monitor").returncode == 0
    try:
        job = submit(nodes=2)
        nodes = running_nodes(lab_cfg, job)
        mapped(lab_cfg, job)
        before = slurm(lab_cfg, "sinfo", "-h", "-N", "-o", "%N %t")
        manage.inject_gpu(lab_cfg, "xid", nodes[0], 2, xid=79)

        def dry_run_of_drain() -> list[str]:
            rows = [
                r for r in ledger.decisions(200) if r.incident == f"{job}.0" and r.action == "drain"
            ]
            if not rows:
                return []
            _, events = ledger.decision(rows[0].id)  # type: ignore[misc]
            return next(
                (e.detail["dry_run"]["commands"] for e in events if "dry_run" in e.detail), []
            )

        assert eventually(dry_run_of_drain, timeout=60, what="a dry run instead of a drain")
        assert slurm(lab_cfg, "sinfo", "-h", "-N", "-o", "%N %t") == before
        assert manage.show_job(lab_cfg, job)["Restarts"] == "0"
    finally:
        assert cli(lab_cfg, "switch", "policy").returncode == 0


def test_resume_returns_only_nodes_slurmedic_drained(lab_cfg: LabConfig, enforce: Ledger) -> None:
    slurm(
        lab_cfg,
        "scontrol",
        "update",
        "nodename=gpu07",
        "state=drain",
        "reason=slurmedic: 9.0 gpu_hardware",
    )
    slurm(
        lab_cfg,
        "scontrol",
        "update",
        "nodename=gpu08",
        "state=drain",
        "reason=bad fan, ticket 4711",
    )
    try:
        out = cli(lab_cfg, "resume", "gpu07", "gpu08")
        assert out.returncode == 0, out.stderr
        assert "scontrol update nodename=gpu07 state=resume" in out.stdout

        def states() -> dict[str, str]:
            out = slurm(lab_cfg, "sinfo", "-h", "-N", "-n", "gpu[07-08]", "-o", "%N %t")
            return dict(ln.split() for ln in out.splitlines())

        # A resumed node is briefly `idle*` until its slurmd registers again.
        eventually(lambda: states()["gpu07"] == "idle", what="gpu07 back in service")
        assert states()["gpu08"].startswith("drain")  # an operator's drain stays
        bad = cli(lab_cfg, "resume", "gpu07;reboot")
        assert bad.returncode == 1 and "nodes:" in bad.stderr
    finally:
        slurm(lab_cfg, "scontrol", "update", "nodename=gpu08", "state=resume", check=False)


@pytest.mark.one_stack
def test_kill_9_while_a_playbook_runs_is_reconciled_and_never_runs_twice(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int], tmp_path: Path
) -> None:
    ledger = serve_slurmedic(lab_cfg, tmp_path, "enforce")
    job = submit(nodes=3)
    nodes = running_nodes(lab_cfg, job)
    mapped(lab_cfg, job)
    manage.inject_gpu(lab_cfg, "xid", nodes[2], 6, xid=79)

    def running() -> bool:
        return any(r.state == "running" for r in ledger.decisions(200) if r.incident == f"{job}.0")

    caught = eventually(running, timeout=60, interval=0.05, what="a playbook running")
    # The service and everything under it (gunicorn, the loop, ansible) die without a word.
    pid = processes.read_pid(lab_cfg, "slurmedic")
    assert pid is not None and caught
    victims = [pid, *processes.descendants(pid)]
    for v in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(v, signal.SIGKILL)
    assert processes.wait_until(lambda: not any(processes.is_alive(v) for v in victims), 10)
    # The crash cut a run short: the ledger still says it is running.
    assert running(), [(r.action, r.state) for r in ledger.incident_decisions(f"{job}.0")]
    (lab_cfg.pids / "slurmedic.pid").unlink(missing_ok=True)
    monitoring.start_slurmedic(lab_cfg, tmp_path / "policy-enforce.yml")
    rows = decided(lab_cfg, ledger, f"{job}.0", 2, {"executed"})
    assert set(rows) == {"drain", "requeue"}
    # Requeued exactly once, drained once, whatever the crash interrupted.
    info = eventually(
        lambda: (i := manage.show_job(lab_cfg, job)) and i["JobState"] == "RUNNING" and i,
        timeout=60,
        what="job running again",
    )
    assert isinstance(info, dict) and info["Restarts"] == "1"
    assert nodes[2] not in running_nodes(lab_cfg, job)
