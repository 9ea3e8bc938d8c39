"""The repair of a node slurmedic drained (webhook/core/repairs.py): the plan its evidence calls
for, held to NVIDIA's catalog; each step after the last on the cluster as Slurm shows it; the
budget, the cap, probation; a person taking over; a dry run's chain."""

from __future__ import annotations

import csv
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from webhook.core import repairs
from webhook.core.cluster import Node
from webhook.core.policy import load_policy
from webhook.core.repairs import Drained, Repair, Step

RULES = Path(__file__).resolve().parents[2] / "alert_rules"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ENFORCE = load_policy({"mode": "enforce"})
MONITOR = load_policy({})


def drained(
    *alerts: tuple[str, int | None], cause: str = "gpu_hardware", ran: bool = True
) -> Drained:
    return Drained("gpu02", 7, "1001.0", cause, T0, ran, tuple(alerts), "gpu")


def node(
    status: str = "drained", reason: str = "slurmedic: 1001.0 gpu_hardware", **kw: object
) -> Node:
    state = "drain" if status.startswith("drain") else status.rstrip("*")
    return Node("gpu02", "gpu", state, reason, status=status, **kw)  # type: ignore[arg-type]


def started(d: Drained, policy=ENFORCE) -> Repair:  # type: ignore[no-untyped-def]
    repair, move = repairs.begin(d, 1, [], policy, T0)
    assert move is None
    return repair


def step(repair: Repair, action: str, state: str, at: datetime, **kw: object) -> Repair:
    s = Step(len(repair.steps) + 10, action, state, at, **kw)  # type: ignore[arg-type]
    return replace(repair, steps=(*repair.steps, s))


def catalog_actions() -> dict[int, str]:
    with (RULES / "nvidia-xid-catalog.tsv").open() as f:
        rows = list(csv.reader(f, delimiter="\t"))
    code = rows[0].index("Code")
    return {int(r[code]): r[8].strip() for r in rows[1:] if r[code]}


def test_the_repair_of_each_xid_is_the_catalog_s_immediate_action() -> None:
    actions = catalog_actions()
    classes = yaml.safe_load((RULES / "xid-classes.yml").read_text())
    reset = {"RESET_GPU", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR"}
    for xid in classes["node"] + classes["contained"]:
        plan, _ = repairs.plan_for(drained(("GpuXidNodeFault", xid)))
        want = (
            "reset_gpu"
            if actions[xid] in reset or xid in classes["contained"]
            else "reboot"
            if actions[xid] in {"RESTART_BM", "RESTART_VM"}
            else "replace"
        )
        assert plan == want, (xid, actions[xid])
    assert set(classes["node"] + classes["contained"]) >= repairs.RESET_XIDS | repairs.REBOOT_XIDS


@pytest.mark.parametrize(
    ("alerts", "cause", "plan"),
    [
        ((("GpuXidNodeFault", 79),), "gpu_hardware", "reboot"),
        ((("GpuDoubleBitEccErrors", None),), "gpu_hardware", "reset_gpu"),
        # The strongest wins: spent rows are not mended by a reset.
        (
            (("GpuDoubleBitEccErrors", None), ("GpuRowRemapFailure", None)),
            "gpu_hardware",
            "replace",
        ),
        ((("GpuXidNodeFault", 48), ("GpuMissing", None)), "gpu_hardware", "reboot"),
        ((("GpuXidNodeFault", 142),), "gpu_hardware", "replace"),
        ((), "node_failure", "reboot"),
        ((), "straggler", "health_check"),
        ((("GpuNvlinkErrors", None),), "degraded", "reset_gpu"),
    ],
)
def test_the_plan_is_what_the_evidence_calls_for(alerts, cause, plan) -> None:  # type: ignore[no-untyped-def]
    assert repairs.plan_for(drained(*alerts, cause=cause))[0] == plan


def test_a_gpu_reset_then_a_check_then_back_in_service_then_probation() -> None:
    repair = started(drained(("GpuXidNodeFault", 48)))
    # A job still runs there: it waits.
    assert repairs.advance(repair, node("draining"), ENFORCE, T0, 0) is None
    move = repairs.advance(repair, node("drained"), ENFORCE, T0, 0)
    assert move is not None and move.state == repairs.REPAIRING
    assert move.decision is not None
    assert (move.decision.action, move.decision.state, move.decision.incident) == (
        "reset_gpu",
        "pending",
        "repair:gpu02",
    )
    assert move.decision.nodes == ("gpu02",)
    repair = step(repair.moved(move.state, T0), "reset_gpu", "running", T0)
    assert repairs.advance(repair, node(), ENFORCE, T0, 1) is None  # its run goes on
    t1 = T0 + timedelta(minutes=1)
    repair = replace(repair, steps=(replace(repair.steps[0], state="executed", done_at=t1),))
    move = repairs.advance(repair, node(), ENFORCE, t1, 1)
    assert move is not None and move.state == repairs.CHECKING
    assert move.decision is not None and move.decision.action == "health_check"
    repair = step(
        repair.moved(move.state, t1), "health_check", "executed", t1, done_at=t1, passed=True
    )
    move = repairs.advance(repair, node(), ENFORCE, t1, 1)
    assert move is not None and move.state == repairs.RESUMING
    assert move.decision is not None and move.decision.action == "resume"
    repair = step(repair.moved(move.state, t1), "resume", "executed", t1, done_at=t1)
    # Slurm shows it in service now, without slurmedic's reason: that is its own resume.
    move = repairs.advance(repair, node("idle", ""), ENFORCE, t1, 1)
    assert move is not None and move.state == repairs.PROBATION and move.decision is None
    repair = repair.moved(move.state, t1)
    assert repairs.advance(repair, node("idle", ""), ENFORCE, t1 + timedelta(days=1), 0) is None
    done = repairs.advance(repair, node("idle", ""), ENFORCE, t1 + timedelta(days=7), 0)
    assert done is not None and done.state == repairs.DONE


def test_a_failed_check_goes_to_a_person_with_its_output() -> None:
    repair = started(drained(("GpuXidNodeFault", 48))).moved(repairs.CHECKING, T0)
    repair = step(repair, "health_check", "executed", T0, done_at=T0, passed=False,
                  detail="exit 226: Memory Fail GPU 3")  # fmt: skip
    move = repairs.advance(repair, node(), ENFORCE, T0, 0)
    assert move is not None and move.state == repairs.REPLACE
    assert move.decision is not None and move.decision.action == "escalate"
    assert move.decision.guard == repairs.REPLACE_GUARD
    assert "Memory Fail GPU 3" in move.decision.reason


def test_a_reboot_waits_for_the_node_to_register_and_a_node_that_never_does_goes_to_a_person() -> (
    None
):
    repair = started(drained(("GpuXidNodeFault", 79))).moved(repairs.REPAIRING, T0)
    repair = step(repair, "reboot", "executed", T0, done_at=T0)
    down = node("down", "slurmedic: repair:gpu02 reboot")
    t = T0 + timedelta(minutes=1)
    assert repairs.advance(repair, replace(down, rebooting=True), ENFORCE, t, 0) is None
    assert repairs.advance(repair, replace(down, status="down*"), ENFORCE, t, 0) is None
    move = repairs.advance(repair, down, ENFORCE, t, 0)  # back, out of service
    assert move is not None and move.decision is not None
    assert (move.state, move.decision.action) == (repairs.CHECKING, "health_check")
    late = T0 + ENFORCE.repairs.reboot_timeout + timedelta(seconds=1)
    move = repairs.advance(repair, replace(down, rebooting=True), ENFORCE, late, 0)
    assert move is not None and move.state == repairs.REPLACE
    assert "did not come back" in move.reason


def test_what_no_repair_mends_goes_straight_to_a_person() -> None:
    repair, move = repairs.begin(drained(("GpuRowRemapFailure", None)), 1, [], ENFORCE, T0)
    assert move is not None and move.state == repairs.REPLACE
    assert move.decision is not None and move.decision.action == "escalate"
    assert "GpuRowRemapFailure" in move.decision.reason and repair.key == "repair:gpu02"


def test_a_node_that_fails_again_after_its_repair_is_replaced_not_rebooted_again() -> None:
    earlier = started(drained(("GpuXidNodeFault", 79)))
    earlier = step(earlier, "reboot", "executed", T0, done_at=T0)
    earlier = step(earlier, "resume", "executed", T0, done_at=T0)
    later = replace(drained(("GpuXidNodeFault", 79)), drain=9, at=T0 + timedelta(days=2))
    repair, move = repairs.begin(later, 2, [earlier], ENFORCE, T0 + timedelta(days=2))
    assert repair.key == "repair:gpu02:2"
    assert move is not None and move.state == repairs.REPLACE
    assert "failed again after its repair repair:gpu02" in move.reason
    # Past the window it is repaired as any node.
    much_later = T0 + timedelta(days=8)
    _, move = repairs.begin(replace(later, at=much_later), 2, [earlier], ENFORCE, much_later)
    assert move is None


def test_the_budget_stops_a_reboot_loop() -> None:
    policy = load_policy({"mode": "enforce", "repairs": {"budget": 2}})
    tried = []
    for i in range(2):  # two reboots that ran, neither resumed (their checks failed)
        r = replace(started(drained(("GpuXidNodeFault", 79))), seq=i + 1)
        tried.append(step(r, "reboot", "executed", T0, done_at=T0))
    _, move = repairs.begin(drained(("GpuXidNodeFault", 79)), 3, tried, policy, T0)
    assert move is not None and move.state == repairs.REPLACE
    assert "budget is spent (2 repairs within 7d)" in move.reason
    # Repairs whose steps never ran (a dry run, a rejection) spend nothing.
    dry = [replace(r, steps=(replace(r.steps[0], state="recorded"),)) for r in tried]
    assert repairs.begin(drained(("GpuXidNodeFault", 79)), 3, dry, policy, T0)[1] is None


def test_the_cap_on_nodes_in_repair_holds_the_rest() -> None:
    policy = load_policy({"mode": "enforce", "repairs": {"max_in_repair": 2}})
    repair = started(drained(("GpuXidNodeFault", 48)), policy)
    assert repairs.advance(repair, node(), policy, T0, 2) is None
    assert repairs.advance(repair, node(), policy, T0, 1) is not None


def test_a_person_who_takes_the_node_over_ends_the_repair() -> None:
    repair = started(drained(("GpuXidNodeFault", 48)))
    later = T0 + timedelta(minutes=5)
    move = repairs.advance(repair, node("idle", ""), ENFORCE, later, 0)
    assert move is not None and move.state == repairs.ENDED and "someone else" in move.reason
    move = repairs.advance(repair, node("drained", "bad fan, RMA 1234"), ENFORCE, later, 0)
    assert move is not None and move.state == repairs.ENDED and "RMA 1234" in move.reason
    # Just after the drain ran, the view may not show it yet: no conclusion.
    assert repairs.advance(repair, node("idle", ""), ENFORCE, T0 + timedelta(seconds=5), 0) is None
    # A step a person rejected ends it too.
    rejected = step(repair.moved(repairs.REPAIRING, T0), "reset_gpu", "rejected", T0)
    move = repairs.advance(rejected, node(), ENFORCE, later, 0)
    assert move is not None and move.state == repairs.ENDED and "rejected" in move.reason


def test_a_dry_run_repair_records_every_step_and_waits_for_nothing_in_slurm() -> None:
    # Monitor mode: the drain was only recorded, so the node is still in service in Slurm.
    policy = load_policy({"mode": "monitor", "actions": {"reboot": "enforce"}})
    repair = started(drained(("GpuXidNodeFault", 79), ran=False), policy)
    actions = []
    t = T0
    for _ in range(3):
        move = repairs.advance(repair, node("allocated", ""), policy, t, 0)
        assert move is not None and move.decision is not None
        d = move.decision
        # Its drain did not run: no step may, whatever its own mode says.
        assert (d.mode, d.state) == ("monitor", "recorded")
        actions.append(d.action)
        # The next step follows once this one's dry run is recorded.
        repair = step(repair.moved(move.state, t), d.action, "recorded", t)
        assert repairs.advance(repair, node("allocated", ""), policy, t, 0) is None
        last = replace(repair.steps[-1], done_at=t)
        repair = replace(repair, steps=(*repair.steps[:-1], last))
    assert actions == ["reboot", "health_check", "resume"]
    move = repairs.advance(repair, node("allocated", ""), policy, t, 0)
    assert move is not None and move.state == repairs.PROBATION


def test_a_move_outside_the_table_is_refused() -> None:
    repair = started(drained(("GpuXidNodeFault", 48)))
    with pytest.raises(repairs.IllegalMove):
        repair.moved(repairs.PROBATION, T0)
    assert repairs.TRANSITIONS[repairs.DONE] == frozenset()
    assert set(repairs.TRANSITIONS) == repairs.STATES


def test_the_policy_s_health_check_is_an_argv_the_playbook_takes() -> None:
    from webhook.core.policy import PolicyError

    assert load_policy({"repairs": {"health_check": ["nhc", "-a"]}}).repairs.health_check == [
        "nhc",
        "-a",
    ]
    for bad in (["nhc", "-a\nrm -rf /"], [], ["x"] * 33):
        with pytest.raises(PolicyError, match=r"^repairs\.health_check"):
            load_policy({"repairs": {"health_check": bad}})


def test_a_dry_run_s_second_alert_of_the_same_fault_is_no_failure_on_probation() -> None:
    dry = replace(started(drained(("GpuXidNodeFault", 79), ran=False)), state=repairs.PROBATION)
    again = replace(drained(("GpuMissing", None), ran=False), drain=8, at=T0 + timedelta(minutes=1))
    assert repairs.covers(dry, again, MONITOR)
    later = replace(again, at=T0 + MONITOR.repeats.apart + timedelta(minutes=1))
    assert not repairs.covers(dry, later, MONITOR)
    # A repair that ran: failing again on probation is a failure however soon.
    ran = replace(started(drained(("GpuXidNodeFault", 79))), state=repairs.PROBATION)
    assert not repairs.covers(ran, replace(again, ran=True), ENFORCE)
    # Under way, it covers any drain of its node.
    assert repairs.covers(started(drained(("GpuXidNodeFault", 79))), later, ENFORCE)


def test_a_repair_has_its_node_out_of_service_from_its_first_step_to_its_resume() -> None:
    repair = started(drained(("GpuXidNodeFault", 79)))
    assert repairs.out_of_service(repair) is None  # waiting: slurmedic did nothing to it yet
    t1, t2 = T0 + timedelta(minutes=1), T0 + timedelta(minutes=4)
    rebooting = step(repair.moved(repairs.REPAIRING, t1), "reboot", "executed", t1, done_at=t1)
    assert repairs.out_of_service(rebooting) == (t1, None)  # still out, however long
    resumed = step(rebooting, "health_check", "executed", t1, done_at=t1, passed=True)
    resumed = step(resumed.moved(repairs.CHECKING, t1).moved(repairs.RESUMING, t1), "resume",
                   "executed", t2, done_at=t2).moved(repairs.PROBATION, t2)  # fmt: skip
    assert repairs.out_of_service(resumed) == (t1, t2)
    # Sent to a person without a resume: out until it closed.
    failed = replace(rebooting, state=repairs.REPLACE, since=t2)
    assert repairs.out_of_service(failed) == (t1, t2)
    # Monitor mode's dry run touched nothing.
    dry = step(started(drained(("GpuXidNodeFault", 79), ran=False)), "reboot", "executed", t1)
    assert repairs.out_of_service(dry) is None


def test_where_slurm_does_not_reboot_a_reboot_goes_to_a_person() -> None:
    """Slinky on Kubernetes: a reboot is a pod's or a node's event, not Slurm's RebootProgram."""
    policy = load_policy({"mode": "enforce", "repairs": {"reboot": False}})
    repair, move = repairs.begin(drained(("GpuXidNodeFault", 79)), 1, [], policy, T0)
    assert repair.plan == "reboot" and move is not None and move.state == repairs.REPLACE
    assert move.decision is not None and move.decision.action == "escalate"
    assert "repairs.reboot: false" in move.reason
    # A GPU reset still runs: the node's own command, not a reboot.
    _, move = repairs.begin(drained(("GpuXidNodeFault", 48)), 1, [], policy, T0)
    assert move is None
