"""Issue 11's decisions on the lab's real Slurm, one test per decision (enforce mode).

1. An idle node that fails three times, slurmedic restarted between failures, is drained three
   times as incidents `node:N`, `node:N:2`, `node:N:3`, with reasons Slurm accepts.
2. A hang seen first by the progress rule (TrainingHang) and only later by the peers' NCCL
   watchdogs waits for the evidence that names the silent node: drain it, requeue without it.
3. A lone application XID on a job that keeps training is recorded (`none`) and escalated, the
   job left alone: never a stop, never a drain.
4. A job that died of an NCCL error on one rank with nobody to blame is requeued (no drain, no
   escalation), and its successor trains; the same failure again goes to a human, naming the
   node where it failed first when that is the same node again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import api, manage, monitoring, processes
from lab.config import LabConfig
from lab.slurm import node_states, slurm
from tests.lab.conftest import (
    PLAYBOOK_RUN_S,
    eventually,
    joblog,
    query,
    running_nodes,
    serve_slurmedic,
)
from tests.lab.test_remediation import checkpointed_job, cli, healthy_after, mapped, restore
from webhook.ledger.schema import DecisionRow
from webhook.ledger.settings import Heartbeat, Jobs
from webhook.ledger.store import Ledger

pytestmark = pytest.mark.lab
__all__ = ["healthy_after"]  # the autouse fixture: each test leaves a healthy cluster

DONE = {"executed", "failed"}


@pytest.fixture
def enforce(lab_cfg: LabConfig, tmp_path: Path) -> Iterator[Ledger]:
    yield serve_slurmedic(lab_cfg, tmp_path, "enforce")
    restore(lab_cfg)


# ---- helpers -------------------------------------------------------------------------------


def rows_of(ledger: Ledger, incident: str) -> list[DecisionRow]:
    return ledger.incident_decisions(incident)


def summary(rows: list[DecisionRow]) -> list[tuple[object, ...]]:
    """What a failed assertion should show of an incident's decisions."""
    return [(r.id, r.action, r.cause, r.nodes, r.exclude, r.guard, r.state) for r in rows]


def wait_rows(
    ledger: Ledger,
    incident: str,
    ready: Callable[[list[DecisionRow]], bool],
    *,
    timeout: float = 120,
    what: str = "",
) -> list[DecisionRow]:
    def probe() -> list[DecisionRow]:
        rows = rows_of(ledger, incident)
        return rows if rows and ready(rows) else []

    try:
        return eventually(probe, timeout=timeout, what=what or f"decisions of {incident}")
    except AssertionError as e:
        raise AssertionError(f"{e}\nrows: {summary(rows_of(ledger, incident))}") from None


def in_force(rows: list[DecisionRow]) -> dict[str, DecisionRow]:
    """The decisions in force (not superseded), by action; one per action."""
    standing = [r for r in rows if r.state != "superseded"]
    by_action = {r.action: r for r in standing}
    assert len(by_action) == len(standing), summary(rows)
    return by_action


def step_of(cfg: LabConfig, job: int) -> float:
    r = query(cfg, f'min(training_step{{slurm_job_id="{job}"}})')
    return r[0]["value"] if r else -1.0


def firing(cfg: LabConfig, alertname: str, **labels: str) -> list[dict[str, object]]:
    sel = ",".join(
        [f'alertname="{alertname}"', 'alertstate="firing"']
        + [f'{k}="{v}"' for k, v in labels.items()]
    )
    return query(cfg, f"ALERTS{{{sel}}}")


def drained(cfg: LabConfig) -> list[str]:
    return sorted(n for n, s in node_states(cfg).items() if s.startswith("drain"))


def loop_looked_after(ledger: Ledger, t: float, *, what: str) -> None:
    """Wait until slurmedic's loop has run a step later than `t` (its heartbeat, every 5 s)."""
    eventually(
        lambda: ledger.setting(Heartbeat).at > t,
        timeout=max(0.0, t - time.time()) + 30,
        what=what,
    )


def running_again(cfg: LabConfig, job: int, restarts: int) -> list[str]:
    def probe() -> list[str]:
        info = manage.show_job(cfg, job)
        if info["JobState"] == "RUNNING" and int(info["Restarts"]) == restarts:
            return running_nodes(cfg, job)
        return []

    try:
        nodes: list[str] = eventually(
            probe, timeout=PLAYBOOK_RUN_S, what=f"attempt {restarts} running"
        )
    except AssertionError as e:
        info = slurm(cfg, "scontrol", "show", "job", str(job), "-o", check=False)
        raise AssertionError(f"{e}\n{info}") from None
    return nodes


# ---- 1. an idle node's failures ------------------------------------------------------------


def test_an_idle_node_that_fails_three_times_is_drained_three_times_across_restarts(
    lab_cfg: LabConfig, enforce: Ledger, tmp_path: Path
) -> None:
    node = "gpu07"  # partition debug: no test job lands there; idle throughout
    policy = tmp_path / "policy-enforce.yml"  # what serve_slurmedic wrote
    assert policy.is_file()
    assert not any(j for j in slurm(lab_cfg, "squeue", "-h", "-w", node, "-o", "%i").split())
    keys = [f"node:{node}", f"node:{node}:2", f"node:{node}:3"]
    for n, (key, gpu) in enumerate(zip(keys, (1, 5, 3), strict=True)):
        if n:
            # A restart between failures: the loop restores its incidents from the ledger.
            assert processes.stop(lab_cfg, "slurmedic")
            monitoring.start_slurmedic(lab_cfg, policy)
        manage.inject_gpu(lab_cfg, "xid", node, gpu, xid=79)
        # Every decision of the failure carried out: the drain, and from the second failure
        # on the escalation beside it (its notice may follow the drain's run by a step).
        rows = wait_rows(
            enforce,
            key,
            lambda rs, n=n: (
                any(r.action == "drain" for r in rs)
                and (n == 0 or any(r.action == "escalate" for r in rs))
                and all(r.state in DONE for r in rs)
            ),
            what=f"the decisions of {key} carried out",
        )
        # From the second failure on, a repeat within 7 days (issue 36): a hardware suspect,
        # escalated beside its drain, the repeat in Slurm's reason.
        suspect = [("escalate", "gpu_hardware", [node], "executed")] if n else []
        assert sorted((r.action, r.cause, r.nodes, r.state) for r in rows) == [
            ("drain", "gpu_hardware", [node], "executed"),
            *suspect,
        ], summary(rows)
        drain = next(r for r in rows if r.action == "drain")
        assert drain.evidence[0]["alertname"] == "GpuXidNodeFault"
        # Slurm holds the reason slurmedic gave, with this failure's key.
        said = f"slurmedic: {key} gpu_hardware" + (f" repeat {n + 1} in 7d" if n else "")
        info = slurm(lab_cfg, "scontrol", "show", "node", node, "-o")
        assert "DRAIN" in info and f"Reason={said}" in info, info
        reason = slurm(lab_cfg, "sinfo", "-h", "-R", "-n", node, "-o", "%E").strip()
        assert reason == said, reason
        # Repaired: the fault cleared (its alert resolves) and a human resumes the node.
        manage.clear(lab_cfg, node)
        eventually(
            lambda: not firing(lab_cfg, "GpuXidNodeFault", node=node),
            timeout=60,
            what="the XID alert resolved",
        )
        out = cli(lab_cfg, "resume", node)
        assert out.returncode == 0, out.stderr
        assert f"scontrol update nodename={node} state=resume" in out.stdout, out.stdout
        eventually(lambda: node_states(lab_cfg)[node] == "idle", what=f"{node} back in service")
    # Exactly three incidents of the node, each one drain (two escalated as repeats), none
    # failed; no fourth.
    ours = [r for r in enforce.decisions(500) if r.incident.startswith(f"node:{node}")]
    assert sorted({r.incident for r in ours}) == keys, summary(ours)
    assert all(r.state == "executed" for r in ours), summary(ours)
    assert sorted(r.action for r in ours) == ["drain"] * 3 + ["escalate"] * 2, summary(ours)


# ---- 2. a hang seen first, the silent node named later ---------------------------------------


def test_a_hang_seen_before_the_peers_timeouts_drains_the_silent_node(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int], tmp_path: Path
) -> None:
    # The order is made by events, not by clocks: the peers' NCCL watchdogs (600 s) fire only
    # when the test says so, after TrainingHang was seen, and the stall waits for them however
    # long they take (hang_wait 1h: no decision on the stall alone can come first).
    enforce = serve_slurmedic(lab_cfg, tmp_path, "enforce", hang_wait="1h")
    job, nodes = checkpointed_job(lab_cfg, submit, nccl_timeout=600.0)
    silent = nodes[1]
    manage.inject_job(lab_cfg, "hang", job, 1)
    incident = f"{job}.0"
    eventually(
        lambda: firing(lab_cfg, "TrainingHang", slurm_job_id=str(job)),
        timeout=60,
        what="TrainingHang firing",
    )
    # The stall alone decides nothing: the incident waits for a node to be named.
    eventually(
        lambda: any(
            a.labels.get("alertname") == "TrainingHang" and a.labels.get("slurm_job_id") == str(job)
            for _, _, a in enforce.alerts_after(0)
        ),
        what="TrainingHang in slurmedic's ledger",
    )
    assert not firing(lab_cfg, "TrainingNcclTimeout", slurm_job_id=str(job))
    assert not rows_of(enforce, incident), summary(rows_of(enforce, incident))
    for rank in range(len(nodes)):
        if nodes[rank] != silent:
            manage.inject_job(lab_cfg, "timeout_now", job, rank)
    rows = wait_rows(
        enforce,
        incident,
        lambda rs: {"drain", "requeue"} <= {r.action for r in rs if r.state in DONE},
        what="drain and requeue carried out",
    )
    force = in_force(rows)
    assert set(force) == {"drain", "requeue"}, summary(rows)
    drain, requeue = force["drain"], force["requeue"]
    assert (drain.cause, drain.nodes, drain.state) == ("node_failure", [silent], "executed")
    assert (requeue.cause, requeue.exclude, requeue.state) == (
        "node_failure",
        [silent],
        "executed",
    ), summary(rows)
    # A decision on the stall alone, if one was made, never ran: it was superseded.
    hang = [r for r in rows if r.cause == "hang"]
    assert all(r.state == "superseded" for r in hang), summary(rows)
    # The evidence: the stall (in the ledger before the timeouts were caused, above) and the
    # peers' timeouts, not the silent rank's. Evidence keeps startsAt to the second, and the
    # timeouts can fire within the second the stall reached slurmedic: not before it.
    starts: dict[str, list[str]] = {}
    for e in drain.evidence:
        starts.setdefault(e["alertname"], []).append(e["startsAt"])
    assert min(starts["TrainingHang"]) <= min(starts["TrainingNcclTimeout"]), drain.evidence
    timed_out = {e["node"] for e in drain.evidence if e["alertname"] == "TrainingNcclTimeout"}
    assert timed_out == set(nodes) - {silent}, drain.evidence
    # Slurm: the node drained with this incident's reason, the successor elsewhere.
    info = slurm(lab_cfg, "scontrol", "show", "node", silent, "-o")
    assert "DRAIN" in info and f"Reason=slurmedic: {incident} node_failure" in info, info
    new = running_again(lab_cfg, job, 1)
    started = time.time()
    assert silent not in new, new
    assert silent in manage.show_job(lab_cfg, job)["ExcNodeList"].split(",")
    # The successor trains (its recovery is verified) and is left alone: its predecessor's
    # stalled progress is no evidence against it, however long a stall would wait.
    eventually(
        lambda: [r for r in enforce.recoveries("recovered") if r.incident == incident],
        timeout=90,
        what="the recovery verified",
    )
    # A restart with the lab's own hang_wait: the successor's stale TrainingHang is read again
    # and must still decide nothing once a whole wait has passed.
    enforce = serve_slurmedic(lab_cfg, tmp_path, "enforce", restart=True)
    wait = float(monitoring.LAB_HANG_WAIT.removesuffix("s"))
    loop_looked_after(enforce, started + wait + 12, what="slurmedic's loop past a stall's wait")
    assert not rows_of(enforce, f"{job}.1"), summary(rows_of(enforce, f"{job}.1"))


# ---- 3. a lone application XID on a job that keeps training ----------------------------------


def test_a_lone_application_xid_leaves_the_training_job_alone_and_tells_people(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job = submit(nodes=2)
    nodes = running_nodes(lab_cfg, job)
    mapped(lab_cfg, job)
    eventually(lambda: step_of(lab_cfg, job) >= 3, what="training past its first steps")
    incident = f"{job}.0"
    manage.inject_gpu(lab_cfg, "xid", nodes[1], 2, xid=13)
    rows = wait_rows(
        enforce,
        incident,
        lambda rs: (
            {r.action for r in rs} >= {"none", "escalate"}
            and all(r.state not in ("pending", "running") for r in rs)
        ),
        timeout=60,
        what="the decisions on the XID",
    )
    assert {(r.action, r.cause, r.guard, r.state) for r in rows} == {
        ("none", "application", "job_running", "recorded"),
        ("escalate", "application", "job_running", "executed"),
    }, summary(rows)
    assert {e["alertname"] for r in rows for e in r.evidence} == {"GpuXidApplicationFault"}
    # People hear of the escalation through the site's Alertmanager, with the job, the cause
    # and a link to the console page, until someone records a verdict on it.
    (escalated,) = [r for r in rows if r.action == "escalate"]
    notice = {"alertname": "SlurmedicEscalation", "incident": incident}
    (posted,) = eventually(
        lambda: api.alerts(lab_cfg, **notice), timeout=60, what="the escalation in Alertmanager"
    )
    assert posted["labels"]["slurm_job_id"] == str(job), posted
    assert posted["labels"]["cause"] == "application" and posted["labels"]["severity"] == "critical"
    assert posted["annotations"]["console"].endswith(f"/console/incident/{incident}"), posted
    # The job keeps training well after the decision: slurmedic leaves it alone.
    at_decision = step_of(lab_cfg, job)
    eventually(
        lambda: step_of(lab_cfg, job) >= at_decision + 50,
        timeout=60,
        what="50 more steps after the decision",
    )
    assert slurm(lab_cfg, "squeue", "-h", "-j", str(job), "-o", "%T").strip() == "RUNNING"
    assert manage.show_job(lab_cfg, job)["Restarts"] == "0"
    assert drained(lab_cfg) == []
    later = rows_of(enforce, incident)
    assert not [r for r in later if r.action in ("stop", "drain", "requeue")], summary(later)
    assert not [r for r in later if r.state == "superseded"], summary(later)
    # Still open: nobody has said anything yet. A verdict handles it.
    assert api.alerts(lab_cfg, **notice), "the escalation resolved before anyone judged it"
    out = cli(lab_cfg, "verdict", str(escalated.id), "agree", "--note", "the owner was told")
    assert out.returncode == 0, out.stderr
    eventually(lambda: not api.alerts(lab_cfg, **notice), timeout=60, what="the notice resolved")


def test_a_job_its_owner_cancels_after_an_application_xid_is_not_stopped(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    """The end of decision 3's job: its owner scancels it. A job someone ended is left alone
    (DESIGN: act on failures; ENDED_ON_PURPOSE): no `stop` of a cancelled job, and the
    escalation that told people about the XID stands."""
    job = submit(nodes=2)
    nodes = running_nodes(lab_cfg, job)
    mapped(lab_cfg, job)
    eventually(lambda: step_of(lab_cfg, job) >= 3, what="training past its first steps")
    incident = f"{job}.0"
    manage.inject_gpu(lab_cfg, "xid", nodes[0], 4, xid=13)
    wait_rows(
        enforce,
        incident,
        lambda rs: {r.action for r in rs} >= {"none", "escalate"},
        timeout=60,
        what="the decisions on the XID",
    )
    eventually(
        lambda: str(job) in enforce.setting(Jobs).root,
        timeout=30,
        what="slurmedic publishing the running job",
    )
    slurm(lab_cfg, "scancel", str(job))
    eventually(
        lambda: manage.show_job(lab_cfg, job)["JobState"] == "CANCELLED", what="job cancelled"
    )
    cancelled = time.time()
    # slurmedic's view has the cancellation (the job leaves the jobs it publishes) ...
    eventually(
        lambda: str(job) not in enforce.setting(Jobs).root,
        timeout=30,
        what="slurmedic seeing the job end",
    )
    # ... and its loop has run past a settle window after that (a revision would be due).
    loop_looked_after(enforce, cancelled + 12, what="slurmedic's loop after the settle window")
    rows = rows_of(enforce, incident)
    assert not [r for r in rows if r.action == "stop"], summary(rows)
    assert {(r.action, r.state) for r in rows} == {
        ("none", "recorded"),
        ("escalate", "executed"),
    }, summary(rows)


# ---- 4. an NCCL crash on one rank, nobody to blame -------------------------------------------


def test_an_nccl_crash_with_nobody_to_blame_is_requeued_then_judged_as_a_repeat(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job, nodes = checkpointed_job(lab_cfg, submit)
    first = nodes[1]
    manage.inject_job(lab_cfg, "crash_nccl", job, 1)
    rows = wait_rows(
        enforce,
        f"{job}.0",
        lambda rs: (
            any(r.action == "requeue" and r.state in DONE for r in rs)
            or any(r.action in ("escalate", "stop", "drain") for r in rs)
        ),
        what="the decision on the crash",
    )
    force = in_force(rows)
    assert set(force) == {"requeue"}, summary(rows)
    requeue = force["requeue"]
    print(f"\nattempt 0: {requeue.cause}: {requeue.reason}")
    assert requeue.cause in ("unknown", "hang"), summary(rows)
    assert (requeue.state, requeue.exclude) == ("executed", []), summary(rows)
    assert not [r for r in rows if r.action in ("drain", "escalate", "stop")], summary(rows)
    assert drained(lab_cfg) == []
    # The successor runs (anywhere: nothing was excluded) and trains past its checkpoint.
    new = running_again(lab_cfg, job, 1)
    line = eventually(
        lambda: [
            ln
            for ln in joblog(lab_cfg, job, new[0], 0).read_text().splitlines()
            if "attempt 1" in ln
        ],
        what="rank 0 restarted",
    )[0]
    resumed = int(line.rsplit(" ", 1)[1])
    assert "resuming from checkpoint" in line and resumed >= 5, line
    eventually(
        lambda: [r for r in enforce.recoveries("recovered") if r.incident == f"{job}.0"],
        timeout=90,
        what="the recovery verified",
    )
    assert step_of(lab_cfg, job) > resumed

    # The same failure again, on rank 1 of attempt 1. Its log lines would be the same alerts
    # as attempt 0's while those still fire (same labels, same startsAt): wait until they end.
    eventually(
        lambda: not firing(lab_cfg, "TrainingNcclTimeout", slurm_job_id=str(job)),
        timeout=90,
        what="attempt 0's NCCL alerts resolved",
    )
    again = new[1]
    manage.inject_job(lab_cfg, "crash_nccl", job, 1)
    rows = wait_rows(
        enforce,
        f"{job}.1",
        lambda rs: any(r.state in DONE | {"recorded"} and r.action != "none" for r in rs),
        what="the decision on the second crash",
    )
    force = in_force(rows)
    print(f"attempt 1 (rank 1 on {again}, attempt 0's on {first}): {summary(rows)}")
    assert "drain" not in force and "requeue" not in force, summary(rows)
    # Nobody to blame, the second time: a human looks, naming the node when it failed first on
    # the same node again. No third start.
    assert set(force) == {"escalate"}, summary(rows)
    esc = force["escalate"]
    assert esc.cause in ("unknown", "hang") and esc.guard == "repeated_failure", summary(rows)
    assert esc.nodes == ([again] if again == first else []), summary(rows)
    assert manage.show_job(lab_cfg, job)["Restarts"] == "1"
