"""The repair loop on the lab's real Slurm (issue 40), with Slurm's own reboot machinery (the
lab's RebootProgram restarts the node's slurmd as if it had booted, its resettable GPU faults
cleared) and the lab's fake `dcgmi diag` as the health check:

- enforce: an XID 79 under a training job: the job requeued elsewhere, the node drained, then
  rebooted (`scontrol reboot ASAP nextstate=DOWN`), checked, and back in service with no person;
  the same node failing again after its repair goes to replacement, never to another reboot;
- a failed row remap (no repair mends it) is escalated for replacement and never rebooted;
- with a budget of one repair, a GPU reset whose health check fails sends the node to
  replacement, and when a person returns it unmended and it fails again, it goes straight back
  to a person, with no second reset;
- monitor: every step of the repair is a dry run, and Slurm is untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from lab import manage, processes
from lab.config import LabConfig
from lab.faults import load_gpu_faults
from lab.slurm import node_states, slurm
from tests.lab.conftest import eventually, query, serve_slurmedic
from tests.lab.test_remediation import checkpointed_job, decided, heal, restore
from webhook.core import lifecycle, repairs
from webhook.core.repairs import Repair
from webhook.ledger.store import Ledger

pytestmark = pytest.mark.lab
# A lab reboot takes seconds; one that never comes back is given up on well within a test.
REPAIRS = {"enabled": True, "budget": 1, "reboot_timeout": "90s", "health_check_timeout": "2m"}
EVER = datetime(2000, 1, 1, tzinfo=UTC)  # every repair a ledger of this module holds


@pytest.fixture(autouse=True)
def healthy_after(lab_cfg: LabConfig) -> Iterator[None]:
    yield
    heal(lab_cfg)


@pytest.fixture(scope="module")
def enforce(lab_cfg: LabConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    yield serve_slurmedic(lab_cfg, tmp_path_factory.mktemp("repairs"), "enforce", repairs=REPAIRS)
    restore(lab_cfg)


def repair_of(ledger: Ledger, node: str, states: frozenset[str], after: int = 0) -> Repair:
    """The node's first repair after its `after`-th, once it is in one of `states` and none of
    its steps still waits for the executor (the repair moves to its state when its last step is
    decided; the executor runs that step a moment later). (A drain of the node while a repair
    is under way, its fault's second alert, is recorded as a repair ended at once: folded into
    the one under way.)"""

    def found() -> Repair | None:
        for r, _ in reversed(ledger.repairs.listed(EVER)):
            if r.node == node and r.seq > after and r.state in states:
                return None if any(s.state in lifecycle.WAITING for s in r.steps) else r
        return None

    try:
        # The whole chain (the alert, the drain, each step's playbook run) took 3 minutes on a
        # CI machine at load 24; the deadline only bounds a hang.
        return eventually(found, timeout=360, what=f"a repair of {node} in {sorted(states)}")
    except AssertionError as e:
        listed = [(r.key, r.state, why, [(s.action, s.state, s.detail) for s in r.steps])
                  for r, why in ledger.repairs.listed(EVER)]  # fmt: skip
        raise AssertionError(f"{e}\nrepairs: {listed}") from None


def reboots(cfg: LabConfig, node: str) -> int:
    """How many reboots of `node` slurmctld logged having issued."""
    log = (cfg.logs / "slurmctld.log").read_text(errors="replace")
    return sum(1 for ln in log.splitlines() if "reboot" in ln.lower() and node in ln)


def test_an_xid_79_node_is_rebooted_checked_and_back_in_service_with_no_person(
    lab_cfg: LabConfig, enforce: Ledger, submit: Callable[..., int]
) -> None:
    job, nodes = checkpointed_job(lab_cfg, submit)
    bad = nodes[1]
    eventually(
        lambda: query(lab_cfg, f'slurmedic_job_eligible{{slurm_job_id="{job}"}} == 1'),
        what="slurmedic sees the job",
    )
    fault_at = time.monotonic()
    manage.inject_gpu(lab_cfg, "xid", bad, 4, xid=79)
    rows = decided(lab_cfg, enforce, f"{job}.0", 2, {"executed", "failed"})
    assert {a: r.state for a, r in rows.items()} == {"drain": "executed", "requeue": "executed"}
    # No person: the node is rebooted, checked and resumed by slurmedic alone.
    repair = repair_of(enforce, bad, frozenset({repairs.PROBATION}))
    back_after = time.monotonic() - fault_at
    assert repair.plan == "reboot" and "XID 79" in repair.why
    steps = {s.action: s for s in repair.steps}
    assert [s.action for s in repair.steps] == ["reboot", "health_check", "resume"]
    assert all(s.state == "executed" for s in repair.steps), repair.steps
    assert steps["health_check"].passed is True
    # Slurm did the reboot itself (RebootProgram), and the node is in service again.
    assert reboots(lab_cfg, bad) >= 1
    info = slurm(lab_cfg, "scontrol", "show", "node", bad, "-o")
    assert "DRAIN" not in info and "DOWN" not in info and "REBOOT" not in info, info
    # Slurm may still flag the node not responding for a ping or two after its slurmd came back
    # (`idle*`, seen on 24.11): back in service is when it answers and takes jobs.
    eventually(
        lambda: node_states(lab_cfg)[bad] in ("idle", "mixed", "allocated"),
        what=f"{bad} answering and taking jobs",
    )
    print(f"\n{bad}: fault to back in service {back_after:.0f} s (no person)")

    # The same node fails again after its repair: replacement, never another reboot.
    before = reboots(lab_cfg, bad)
    manage.inject_gpu(lab_cfg, "xid", bad, 2, xid=79)
    again = repair_of(enforce, bad, frozenset({repairs.REPLACE}), after=repair.seq)
    assert [s.action for s in again.steps] == ["escalate"]
    escalation = enforce.incident_decisions(again.key)
    assert [d.action for d in escalation] == ["escalate"], escalation
    assert "failed again after its repair" in escalation[0].reason
    assert reboots(lab_cfg, bad) == before
    assert "DRAIN" in slurm(lab_cfg, "scontrol", "show", "node", bad, "-o")


def test_a_failed_row_remap_is_escalated_for_replacement_and_never_rebooted(
    lab_cfg: LabConfig, enforce: Ledger
) -> None:
    node = lab_cfg.nodes[-1]
    before = reboots(lab_cfg, node)
    manage.inject_gpu(lab_cfg, "row_remap_failure", node, 3)
    repair = repair_of(enforce, node, frozenset({repairs.REPLACE}))
    escalation = enforce.incident_decisions(repair.key)
    assert [d.action for d in escalation] == ["escalate"]
    assert "GpuRowRemapFailure" in escalation[0].reason
    assert reboots(lab_cfg, node) == before
    info = slurm(lab_cfg, "scontrol", "show", "node", node, "-o")
    assert "DRAIN" in info and "Reason=slurmedic:" in info


def test_a_reset_that_does_not_mend_the_node_spends_its_budget_and_stops_the_loop(
    lab_cfg: LabConfig, enforce: Ledger
) -> None:
    """Budget 1: a GPU reset, its health check failing, replacement; a person resumes the node
    unmended and it fails again: replacement at once, no second reset (no reset loop)."""
    node = lab_cfg.nodes[-2]
    manage.inject_node(lab_cfg, "diag_fail", node)
    manage.inject_gpu(lab_cfg, "xid", node, 5, xid=48)
    first = repair_of(enforce, node, frozenset({repairs.REPLACE}))
    assert first.plan == "reset_gpu", first
    assert [(s.action, s.state) for s in first.steps] == [
        ("reset_gpu", "executed"),
        ("health_check", "executed"),
        ("escalate", "executed"),
    ], first.steps
    # The reset ran on the node: it cleared the XID 48 (a reset mends it), not the diag fault.
    gpu_faults, node_faults = load_gpu_faults(lab_cfg.faults_file).of_node(node)
    assert gpu_faults == [] and node_faults == {"diag_fail"}
    escalation = enforce.incident_decisions(first.key)
    assert [d.action for d in escalation] == ["reset_gpu", "health_check", "escalate"]
    assert "health check failed after the reset gpu" in escalation[-1].reason
    assert "DRAIN" in slurm(lab_cfg, "scontrol", "show", "node", node, "-o")

    # A person returns it unmended; its GPU fails again.
    slurm(lab_cfg, "scontrol", "update", f"nodename={node}", "state=resume")
    eventually(lambda: node_states(lab_cfg)[node] == "idle", what=f"{node} resumed")
    manage.inject_gpu(lab_cfg, "xid", node, 5, xid=48)
    again = repair_of(enforce, node, frozenset({repairs.REPLACE}), after=first.seq)
    assert [s.action for s in again.steps] == ["escalate"], again.steps
    escalation = enforce.incident_decisions(again.key)
    assert "repair budget is spent (1 repairs" in escalation[0].reason, escalation[0].reason
    # No reset this time: the fault is still on the GPU, the node drained for a person.
    assert [f.xid for f in load_gpu_faults(lab_cfg.faults_file).of_node(node)[0]] == [48]
    assert "DRAIN" in slurm(lab_cfg, "scontrol", "show", "node", node, "-o")


def test_in_monitor_mode_every_repair_step_is_a_dry_run_and_slurm_is_untouched(
    lab_cfg: LabConfig, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ledger = serve_slurmedic(
        lab_cfg, tmp_path_factory.mktemp("repairs-monitor"), "monitor", repairs=REPAIRS
    )
    try:
        node = lab_cfg.nodes[0]
        before = (reboots(lab_cfg, node), node_states(lab_cfg)[node])
        manage.inject_gpu(lab_cfg, "xid", node, 1, xid=48)
        repair = repair_of(ledger, node, frozenset({repairs.PROBATION}))
        assert repair.plan == "reset_gpu" and repair.dry_run
        assert [(s.action, s.state) for s in repair.steps] == [
            ("reset_gpu", "recorded"),
            ("health_check", "recorded"),
            ("resume", "recorded"),
        ]

        # Each step's dry run says what it would run (the executor records it beside).
        def dry_runs() -> dict[str, list[str]]:
            found = {}
            for s in repair.steps:
                got = ledger.decision(s.id)
                assert got is not None
                runs = [e.detail["dry_run"] for e in got[1] if "dry_run" in e.detail]
                if runs:
                    found[s.action] = runs[-1]["commands"]
            return found if len(found) == len(repair.steps) else {}

        commands = eventually(dry_runs, what="each step's dry run")
        # The check's command; the reset and the resume act only on a node drained by
        # slurmedic, and this one was never drained: their dry runs say nothing would run.
        assert any("lab.dcgmi" in c and "diag" in c for c in commands["health_check"]), commands
        assert commands["reset_gpu"] == [] and commands["resume"] == [], commands
        assert (reboots(lab_cfg, node), node_states(lab_cfg)[node]) == before
        info = slurm(lab_cfg, "scontrol", "show", "node", node, "-o")
        assert "DRAIN" not in info and "REBOOT" not in info
    finally:
        processes.stop(lab_cfg, "slurmedic")
