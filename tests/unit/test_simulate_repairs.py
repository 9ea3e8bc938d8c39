"""The repair loop in the goodput simulator: the real core (webhook.core.repairs) plans and
moves each repair of a node slurmedic drained; the world takes the model's time for each step
and mends the model's share of each fault; the report counts nodes out of service and the
cluster's goodput, with the loop and without."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from webhook.cli import main
from webhook.core.decisions import Decision
from webhook.core.lifecycle import PENDING
from webhook.core.policy import load_policy
from webhook.core.repairs import PROBATION, REPLACE
from webhook.simulate import report
from webhook.simulate.model import SimConfig
from webhook.simulate.responders import NOREPAIR, Slurmedic
from webhook.simulate.run import Outcome, simulate
from webhook.simulate.site import delays
from webhook.simulate.trace import Fault
from webhook.simulate.world import World, when

H = 3600.0
REBOOT_AND_CHECK = 10 * 60 + 2 * 60  # the model's defaults: a reboot, then dcgmi diag -r 2
NODE = "gpu00006"  # node 5: the big job runs there


def small(days: float = 3, **kw: object) -> SimConfig:
    """64 nodes; one 48-node job and two 4-node jobs; 8 spare nodes."""
    base: dict[str, object] = {
        "days": days,
        "nodes": 64,
        "jobs": [
            {"name": "big", "nodes": 48, "restart": "5m"},
            {"name": "small", "count": 2, "nodes": 4, "restart": "2m"},
        ],
    }
    return SimConfig.model_validate(base | kw)


def mends(share: float) -> dict[str, object]:
    return {"repairs": {"fixes": {"gpu": share, "node": share, "link": share}}}


def run(cfg: SimConfig, policy: str, faults: list[Fault], **pol: object) -> Outcome:
    return simulate(cfg, policy, policy=load_policy(pol), faults=faults)


def drive(world: World, responder: Slurmedic) -> None:
    """The run's loop (webhook.simulate.run), for a world a test looks into afterwards."""
    world.on_alert, world.on_change = responder.alert, responder.changed
    world.place()
    world.flush()
    end = world.cfg.seconds
    while True:
        event, due = world.next_event(), responder.next_due()
        if event is not None and event <= end and (due is None or event <= due):
            world.step()
        elif due is not None and due <= end:
            world.now = max(world.now, due)
            responder.tick()
        else:
            break


def test_a_mended_fault_is_back_after_its_reboot_and_check_with_the_loop_after_a_person_without():
    cfg = small(**mends(1.0))
    fault = [Fault(2 * H, "gpu", 5, gpu=3)]
    world = World(cfg, delays())
    responder = Slurmedic(world, load_policy({}))
    world.later(2 * H, lambda: world.fail(fault[0]))
    drive(world, responder)
    assert responder.repairs is not None
    (repair,) = responder.repairs.history[NODE]
    # XID 79: the catalog's reboot, then the health check, then back to service.
    assert repair.plan == "reboot" and repair.state == PROBATION
    assert [s.action for s in repair.steps] == ["reboot", "health_check", "resume"]
    reboot, check, _ = repair.steps
    assert reboot.done_at is not None and check.done_at is not None and check.passed
    assert (reboot.done_at - reboot.at).total_seconds() == 600
    assert (check.done_at - check.at).total_seconds() == 120
    assert world.nodes[5].out == "" and world.nodes[5].broken is None
    # Out of service from its drain (its job had already failed) to its resume.
    assert world.tally.out_node_seconds == pytest.approx(REBOOT_AND_CHECK, abs=1)
    assert (world.tally.repairs, world.tally.repaired, world.tally.replaced) == (1, 1, 0)

    without = run(cfg, NOREPAIR, fault)
    assert (without.tally.repairs, without.tally.repaired) == (0, 0)
    assert without.out_node_hours == pytest.approx(cfg.repair.total_seconds() / H)
    loop = run(cfg, "slurmedic", fault)
    assert loop.out_node_hours == pytest.approx(REBOOT_AND_CHECK / H, abs=0.01)
    assert (loop.tally.out_peak, without.tally.out_peak) == (1, 1)


def test_a_repair_that_mends_nothing_fails_its_check_and_waits_for_the_person():
    cfg = small(**mends(0.0))
    got = run(cfg, "slurmedic", [Fault(2 * H, "gpu", 5, gpu=3)])
    assert (got.tally.repairs, got.tally.repaired, got.tally.replaced) == (1, 0, 1)
    # The person's mending was due from the drain: the reboot and check cost nothing more.
    assert got.out_node_hours == pytest.approx(cfg.repair.total_seconds() / H)


@pytest.mark.parametrize("xid", [54, 78, 142])  # CONTACT_SUPPORT and kin: node codes, no repair
def test_a_fault_the_core_says_replace_is_never_reset_or_rebooted(xid: int):
    cfg = small(**mends(1.0))
    fault = [Fault(2 * H, "gpu", 5, gpu=3, xid=xid)]
    world = World(cfg, delays())
    responder = Slurmedic(world, load_policy({}))
    world.later(2 * H, lambda: world.fail(fault[0]))
    drive(world, responder)
    assert responder.repairs is not None
    (repair,) = responder.repairs.history[NODE]
    assert repair.plan == "replace" and repair.state == REPLACE
    assert [s.action for s in repair.steps] == ["escalate"]
    assert (world.tally.repairs, world.tally.repaired, world.tally.replaced) == (0, 0, 1)
    loop = run(cfg, "slurmedic", fault)
    assert loop.out_node_hours == run(cfg, NOREPAIR, fault).out_node_hours == 48


def test_a_node_failing_again_after_its_repair_goes_to_a_person_not_to_another_reboot():
    cfg = small(**mends(1.0))
    faults = [Fault(2 * H, "gpu", 5, gpu=3), Fault(10 * H, "gpu", 5, gpu=1)]
    got = run(cfg, "slurmedic", faults)
    assert (got.tally.repairs, got.tally.repaired, got.tally.replaced) == (1, 1, 1)
    # The second time it waits for the person's mending, 48 h from its second drain.
    assert got.out_node_hours == pytest.approx(REBOOT_AND_CHECK / H + 48, abs=0.1)


@pytest.mark.parametrize(("budget", "reboots"), [(2, 2), (1, 1)])
def test_the_budget_stops_a_loop_of_reboots_that_mend_nothing(budget: int, reboots: int):
    # The same node fails three times within a week, each time after the person mended it
    # (48 h): its repairs fail their checks, and past the budget it is not rebooted again.
    cfg = small(days=7, **mends(0.0))
    faults = [Fault(t * H, "gpu", 5, gpu=3) for t in (2, 52, 102)]
    got = run(cfg, "slurmedic", faults, repairs={"budget": budget})
    assert got.tally.drains == 3
    assert (got.tally.repairs, got.tally.repaired, got.tally.replaced) == (reboots, 0, 3)


def test_a_healthy_drained_node_passes_its_check_and_is_back_quickly():
    """A node drained with nothing wrong: the loop's reboot and check return it; without the
    loop it waits for the person who finds nothing and resumes it."""
    cfg = small(**mends(0.0))
    out = {}
    for name, pol in (("loop", {}), ("person", {"repairs": {"enabled": False}})):
        world = World(cfg, delays())
        responder = Slurmedic(world, load_policy(pol))
        idle = world.nodes[60].name  # a spare node

        def drain(r: Slurmedic = responder, node: str = idle) -> None:
            at = when(r.world.now)
            r._decided([_drain(at, node)])

        world.later(2 * H, drain)
        drive(world, responder)
        assert world.tally.healthy_drained == 1 and world.nodes[60].out == ""
        out[name] = world.tally.out_node_seconds
    assert out["loop"] == pytest.approx(REBOOT_AND_CHECK, abs=1)
    assert out["person"] == pytest.approx(
        World(cfg, delays()).person("resume", world.nodes[60].name, f"{2 * H:.0f}")
    )


def _drain(at: datetime, node: str) -> Decision:
    return Decision(
        at=at.astimezone(UTC),
        incident=f"node:{node}",
        job=None,
        action="drain",
        cause="node_failure",
        reason="a test's drain",
        nodes=(node,),
        mode="enforce",
        state=PENDING,
    )


def test_the_report_shows_nodes_out_of_service_and_the_cluster_s_goodput(tmp_path: Path):
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(
        "nodes: 64\nleaf_nodes: 16\njobs:\n  - {name: big, nodes: 48}\nrates: {gpu: 100}\n"
        "repairs: {fixes: {gpu: 1}}\n"
    )
    got = CliRunner().invoke(
        main,
        ["simulate", "--cluster", str(cluster), "--days", "2", "--format", "json",
         "--policies", f"slurmedic,{NOREPAIR}"],
    )  # fmt: skip
    assert got.exit_code == 0, got.output
    loop, without = json.loads(got.stdout)["outcomes"]
    assert (loop["policy"], without["policy"]) == ("slurmedic", NOREPAIR)
    for o in (loop, without):
        assert 0 < o["goodput_cluster"] < o["ettr_cluster"]  # 16 of 64 nodes run no job
        assert o["out_peak"] >= 1 and o["out_node_hours"] == pytest.approx(o["out_mean"] * 48)
    assert loop["repaired"] > 0 and without["repaired"] == 0
    assert loop["out_node_hours"] < without["out_node_hours"]
    md = report.as_markdown([run(small(), "slurmedic", [Fault(2 * H, "gpu", 5)])], "")
    for title in ("cluster goodput", "nodes out (mean)", "nodes out (peak)", "node-hours out"):
        assert f"| {title} |" in md
    bad = tmp_path / "bad.yml"
    bad.write_text("repairs: {fixes: {gpu: 2}}\n")
    got = CliRunner().invoke(main, ["simulate", "--cluster", str(bad)])
    assert got.exit_code == 1 and "repairs.fixes" in got.output
