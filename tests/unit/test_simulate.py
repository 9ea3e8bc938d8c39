"""The goodput simulator: its failure trace, the world it simulates, the four policies on it
(slurmedic's through the real core), and `slurmedic simulate`."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
from click.testing import CliRunner

from webhook.cli import main
from webhook.core.alerts import Alert
from webhook.core.policy import load_policy
from webhook.simulate.model import LLAMA3_CAUSES, Blips, Delays, SimConfig, llama3_rates
from webhook.simulate.responders import Informed, Slurmedic
from webhook.simulate.run import Outcome, simulate
from webhook.simulate.site import delays
from webhook.simulate.trace import Fault, draw
from webhook.simulate.world import World, node_name, when

H = 3600.0


def small(**kw: object) -> SimConfig:
    """64 nodes in 4 leaves; one 48-node job and two 4-node jobs; 8 spare nodes."""
    base: dict[str, object] = {
        "days": 1,
        "nodes": 64,
        "jobs": [
            {"name": "big", "nodes": 48, "restart": "5m"},
            {"name": "small", "count": 2, "nodes": 4, "restart": "2m"},
        ],
    }
    return SimConfig.model_validate(base | kw)


def with_big(big: dict[str, object], **kw: object) -> SimConfig:
    """small(), its 48-node job with `big`'s keys."""
    jobs = [{"name": "big", "nodes": 48} | big, {"name": "small", "count": 2, "nodes": 4}]
    return small(jobs=jobs, **kw)


RETRY = '{"slurmedic": {"retry_application": true}}'


def run(cfg: SimConfig, policy: str, faults: list[Fault], **pol: object) -> Outcome:
    return simulate(cfg, policy, policy=load_policy(pol), faults=faults)


def test_the_default_trace_is_llama_3s_mix_and_a_seed_is_one_trace():
    # 419 interruptions less the 6 silent data corruptions no rule sees.
    counted = sum(sum(c.values()) for c in LLAMA3_CAUSES.values())
    assert counted == 413
    assert sum(llama3_rates().values()) * 54 * 2048 / 1000 == pytest.approx(413)
    cfg = SimConfig(days=10)
    assert draw(cfg) == draw(cfg)
    assert draw(cfg) != draw(cfg.model_copy(update={"seed": 2}))
    kinds = {f.kind for f in draw(SimConfig())}
    assert kinds == {"gpu", "node", "link", "switch", "app", "hang"}


def test_a_gpu_off_the_bus_slurmedic_drains_that_node_and_requeues_the_job_away_from_it():
    cfg = small()
    fault = [Fault(2 * H, "gpu", 5, gpu=3)]  # node 5 runs the big job
    got = {p: run(cfg, p, fault) for p in ("none", "slurmedic", "oracle")}
    s = got["slurmedic"]
    assert (s.tally.drains, s.tally.healthy_drained, s.tally.requeues) == (1, 0, 1)
    assert s.decisions >= 2
    # Each answer costs the big job less than no automation's, and none beats the oracle.
    assert got["oracle"].ettr_largest >= s.ettr_largest > got["none"].ettr_largest
    # It lost the work since its last checkpoint and its restart, about 30 minutes of 24 h.
    assert 1 - 30 / (24 * 60) - 0.03 < s.ettr_largest / got["oracle"].ettr_largest <= 1


def test_informed_does_the_oracle_s_right_thing_once_the_first_alert_is_in():
    """What the monitoring's delays cost by themselves: `informed` is the oracle, late by the
    alert's path (scrape, evaluation, Alertmanager), and slurmedic later still (its settle)."""
    cfg = small()
    gpu = [Fault(2 * H, "gpu", 5, gpu=3)]  # node 5 runs the big job
    got = {p: run(cfg, p, gpu) for p in ("slurmedic", "informed", "oracle")}
    told = got["informed"]
    assert (told.tally.drains, told.tally.healthy_drained, told.tally.requeues) == (1, 0, 1)
    assert got["oracle"].gpu_hours_lost < told.gpu_hours_lost < got["slurmedic"].gpu_hours_lost
    # Told by the job's own alerts: an application crash a restart cures, requeued by it (not
    # by the job's owner, who would come hours later).
    app = [Fault(2 * H, "app", 5)]
    told, alone = run(cfg, "informed", app), run(cfg, "none", app)
    assert (told.tally.requeues, told.tally.owner_restarts, told.tally.stops) == (1, 0, 0)
    assert told.gpu_hours_lost < alone.gpu_hours_lost
    # Nothing but the node's own alert tells of a failure of a node that runs nothing.
    idle = run(cfg, "informed", [Fault(2 * H, "node", 62)])  # one of the 8 spare nodes
    assert (idle.tally.drains, idle.tally.requeues) == (1, 0)


def test_informed_takes_a_leaf_s_port_down_alerts_for_the_switch():
    """A leaf's storm under a 32-node job that fits off the leaf: the first port-down alert
    of any of the leaf's nodes tells of the switch; the job is requeued off the leaf within
    that alert's path of the oracle (its `for:`, a scrape, an evaluation, the route), not
    after the job's own NCCL timeout; nothing is drained."""
    cfg = small(
        jobs=[
            {"name": "big", "nodes": 32, "restart": "5m"},
            {"name": "small", "count": 2, "nodes": 4, "restart": "2m"},
        ]
    )
    storm = [Fault(2 * H, "switch", 1)]
    told, oracle = run(cfg, "informed", storm), run(cfg, "oracle", storm)
    assert (told.tally.drains, told.tally.requeues) == (0, 1)
    d = Delays()
    path = d.ib_port_down_for + d.scrape + d.evaluation + d.group_interval
    assert 0 < told.gpu_hours_lost - oracle.gpu_hours_lost < 32 * 8 * path / H


def test_informed_does_not_take_an_earlier_failure_s_late_alert_for_a_newer_one():
    world = World(small(), Delays())
    told = Informed(world)
    world.place()
    node = world.nodes[5]
    assert node.job is not None
    job = world.jobs[node.job]
    world.now = 2 * H
    told.failure(Fault(2 * H, "gpu", 5, gpu=3), [job])

    def alert(at: float) -> Alert:
        labels = {"alertname": "GpuXidNodeFault", "node": node.name, "signal": "gpu_hw"}
        return Alert.model_construct(
            status="firing", labels=labels, annotations={}, startsAt=when(at), endsAt=None
        )

    told.alert(alert(2 * H - 120))  # started before the failure: of an earlier one
    assert (world.tally.drains, world.tally.requeues) == (0, 0)
    told.alert(alert(2 * H + 20))
    assert (world.tally.drains, world.tally.requeues) == (1, 1)
    told.alert(alert(2 * H + 30))  # the same failure's next alert: remedied once
    assert (world.tally.drains, world.tally.requeues) == (1, 1)


def drive(world: World, responder: Slurmedic, seen: list[Alert] | None = None) -> None:
    """The run's loop (webhook.simulate.run) for a world a test watches; `seen`: every alert."""

    def alert(a: Alert) -> None:
        if seen is not None:
            seen.append(a)
        responder.alert(a)

    world.on_alert, world.on_change = alert, responder.changed
    world.place()
    world.flush()
    while world.next_event() is not None or responder.next_due() is not None:
        event, due = world.next_event(), responder.next_due()
        if event is not None and (due is None or event <= due):
            world.step()
        else:
            assert due is not None
            world.now = due
            responder.tick()


def test_the_decisions_come_from_the_real_core():
    cfg = small(verify=True)
    world = World(cfg, delays())
    responder = Slurmedic(world, load_policy({}))
    world.later(H, lambda: world.fail(Fault(H, "gpu", 5, gpu=1)))
    drive(world, responder)
    acted = [(d.incident, d.action, d.nodes, d.exclude, d.cause) for d in responder.decisions]
    assert ("1.0", "drain", ("gpu00006",), (), "gpu_hardware") in acted
    assert ("1.0", "requeue", (), ("gpu00006",), "gpu_hardware") in acted
    big = world.jobs[1]
    assert big.state == "RUNNING" and big.restarts == 1
    assert world.nodes[5].index not in big.nodes
    # The recovery check saw the successor train past where the job had failed.
    assert [h.job for h in responder.engine.guards.history if h.action == "recovered"] == [1]


def test_a_task_that_fails_again_within_the_window_is_a_new_alert():
    # The rule names each failure by its line's time: a requeued attempt that crashes again
    # minutes later is an alert slurmedic sees (the old one still firing would hide it).
    asking = with_big({"restart": "2m", "comment": RETRY})
    world = World(asking, delays())
    responder = Slurmedic(world, load_policy({"retry_budget": {"max_requeues": 10}}))
    fault = Fault(2 * H, "app", 5, recurs=True, fix_after=H)
    world.later(fault.at, lambda: world.fail(fault))
    seen: list[Alert] = []
    drive(world, responder, seen)
    failed = sorted(
        {int(a.labels["failed_at"]) for a in seen if a.labels["alertname"] == "TrainingTaskFailed"}
    )
    assert failed[0] == int(when(fault.at).timestamp())
    assert len(failed) >= 2 and failed[1] - failed[0] < 600  # within the rule's window
    assert sum(d.action == "requeue" for d in responder.decisions) >= 2


def test_a_successor_still_short_of_the_step_at_its_deadline_is_a_failed_recovery():
    # A 45-minute restart: the successor cannot pass the step its predecessor failed at
    # within the deadline (30 minutes and the 14 minutes of work to redo). The check judges it
    # at the deadline, not at the cluster's next change.
    slow = with_big({"restart": "45m"}, verify=True)
    world = World(slow, delays())
    responder = Slurmedic(world, load_policy({}))
    world.later(2 * H, lambda: world.fail(Fault(2 * H, "gpu", 5, gpu=1)))
    drive(world, responder)
    (late,) = [d for d in responder.decisions if d.guard == "recovery_failed"]
    assert "did not pass step" in late.reason and "of them to redo lost work" in late.reason
    big = world.jobs[1]
    assert big.restarts == 1  # the successor runs on: escalated, not stopped
    judged = (late.at - when(big.started)).total_seconds()
    assert 30 * 60 < judged < 30 * 60 + 15 * 60


def test_a_leaf_switch_storm_naive_drains_healthy_nodes_slurmedic_drains_none():
    cfg = small()
    storm = [Fault(2 * H, "switch", 1)]  # leaf 1: nodes 16-31, under the big job
    naive = run(cfg, "naive", storm)
    ours = run(cfg, "slurmedic", storm)
    assert naive.tally.healthy_drained >= 16
    assert ours.tally.healthy_drained == 0 and ours.tally.drains == 0
    assert ours.tally.escalations >= 1  # a shared cause: a person decides the job
    # Too little capacity away from the leaf: the person requeues it once the leaf is mended.
    assert ours.tally.requeues == 1
    assert ours.ettr_largest > 0.8


def test_a_bug_that_recurs_is_stopped_and_one_a_restart_cures_is_a_needless_stop():
    cfg = small()
    recurs = [Fault(2 * H, "app", 5, recurs=True, fix_after=3 * H)]
    once = [Fault(2 * H, "app", 5)]
    stopped = run(cfg, "slurmedic", recurs)
    assert (stopped.tally.stops, stopped.tally.needless_stops) == (1, 0)
    needless = run(cfg, "slurmedic", once)
    assert (needless.tally.stops, needless.tally.needless_stops) == (1, 1)
    # The job's owner can ask for requeues of its own crashes: then a restart cures it.
    asking = small(
        jobs=[
            {"name": "big", "nodes": 48, "comment": '{"slurmedic": {"retry_application": true}}'},
            {"name": "small", "count": 2, "nodes": 4},
        ]
    )
    retried = run(asking, "slurmedic", once)
    assert (retried.tally.stops, retried.tally.requeues) == (0, 1)
    assert retried.ettr_largest > needless.ettr_largest


def test_past_the_retry_budget_the_core_stops_a_job_whose_nodes_keep_failing():
    cfg = small()
    faults = [Fault((2 + i) * H, "gpu", 5 + i) for i in range(4)]
    default = run(cfg, "slurmedic", faults)
    assert default.tally.requeues == 3 and default.tally.needless_stops == 1
    assert default.guards == {"retry_budget_exhausted": 2}  # the stop and its escalation
    sized = run(cfg, "slurmedic", faults, retry_budget={"max_requeues": 10})
    assert sized.tally.requeues == 4 and sized.tally.stops == 0
    assert sized.ettr_largest > default.ettr_largest


def test_the_recovery_check_stops_a_crash_loop_the_budget_would_let_run():
    # The owner asked for requeues of the job's own crashes; its bug recurs on every restart,
    # minutes in, before the first checkpoint. As the live loop does (webhook.service.verify),
    # each failed restart is escalated and counted, and the core's `no_progress` guard stops
    # the job after two; without the check, only the budget stops it.
    asking = with_big({"comment": RETRY}, verify=True)
    loop = [Fault(2 * H, "app", 5, recurs=True, fix_after=12 * H)]
    checked = run(asking, "slurmedic", loop, retry_budget={"max_requeues": 10})
    unchecked = run(
        asking.model_copy(update={"verify": False}),
        "slurmedic",
        loop,
        retry_budget={"max_requeues": 10},
    )
    assert checked.guards.get("recovery_failed", 0) >= 2 and "no_progress" in checked.guards
    assert checked.tally.stops == 1 and checked.tally.requeues <= 4
    assert unchecked.guards == {"retry_budget_exhausted": 2}
    assert unchecked.tally.requeues == 10 and unchecked.tally.stops == 1


def test_every_policy_on_a_drawn_trace():
    cfg = small(days=3, seed=4, rates={k: v * 20 for k, v in llama3_rates().items()})
    faults = draw(cfg)
    assert len(faults) > 10
    got = {p: run(cfg, p, faults) for p in ("none", "naive", "slurmedic", "oracle")}
    assert all(o.ettr_cluster <= got["oracle"].ettr_cluster for o in got.values())
    assert got["oracle"].tally.healthy_drained == 0
    assert got["naive"].tally.healthy_drained > 0


def test_the_loss_by_cause_adds_up_and_names_the_fault_that_cost_it():
    cfg = small(days=3, seed=4, rates={k: v * 20 for k, v in llama3_rates().items()})
    faults = draw(cfg)
    for p in ("none", "naive", "slurmedic", "oracle"):
        o = run(cfg, p, faults)
        assert sum(o.lost_by_kind.values()) == pytest.approx(o.gpu_hours_lost, abs=1), p
        assert set(o.lost_by_kind) <= {*{f.kind for f in faults}, "start", "needless"}, p
    # One GPU off the bus under the big job: the whole loss is that fault's, and it is the
    # work since the checkpoint, the restart and the wait (more with no automation).
    fault = [Fault(2 * H, "gpu", 5, gpu=3)]
    alone = {p: run(small(), p, fault) for p in ("none", "slurmedic", "oracle")}
    for p, o in alone.items():
        assert list(o.lost_by_kind) == ["gpu"], (p, o.lost_by_kind)
    assert alone["none"].lost_by_kind["gpu"] > alone["slurmedic"].lost_by_kind["gpu"]
    assert alone["slurmedic"].lost_by_kind["gpu"] >= alone["oracle"].lost_by_kind["gpu"] > 0
    # A leaf's storm: what its jobs lost is the switch's, whoever answers.
    for p in ("naive", "slurmedic"):
        storm = run(small(), p, [Fault(2 * H, "switch", 1)])
        assert list(storm.lost_by_kind) == ["switch"], (p, storm.lost_by_kind)


def test_a_dead_link_nccl_reports_at_once_is_requeued_after_the_node_s_drain():
    """A link dies under the big job. Hanging until the collective timeout, the job is still
    running when the port-down alert comes: drain and requeue off the node. With NCCL's
    transport error (fabric_error) the job fails in seconds, before that alert: with blame_wait
    (the default) the job's requeue does not come before the node's drain, and its next attempt
    runs (the alert joining the job's incident is held by the replay scenario
    decide-comm-error-waits-for-the-node-s-alert); without the wait the blind requeue comes
    first, and the next attempt lands on the dead link and fails again."""
    fault = [Fault(2 * H, "link", 5)]
    quick = replace(delays(), fabric_error=10.0)
    waits = load_policy({"blame_wait": "2m"})
    hangs = simulate(small(), "slurmedic", policy=waits, faults=fault)
    errors = simulate(small(), "slurmedic", policy=waits, delays=quick, faults=fault)
    hasty = simulate(
        small(), "slurmedic", policy=load_policy({"blame_wait": "0s"}), delays=quick, faults=fault
    )
    for o in (hangs, errors):
        assert (o.tally.drains, o.tally.healthy_drained, o.tally.requeues) == (1, 0, 1)
    assert (hasty.tally.drains, hasty.tally.requeues, hasty.tally.failures) == (1, 2, 2)
    assert errors.lost_by_kind["link"] < hasty.lost_by_kind["link"]


def test_the_delays_come_from_the_rule_config_and_alertmanagers_route():
    d = delays()
    assert (d.hang_after, d.ib_port_down_for, d.group_interval) == (600, 60, 5)


def test_slurmedic_simulate_prints_a_row_a_policy_and_a_sweep(tmp_path: Path):
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(
        "nodes: 64\nleaf_nodes: 16\njobs:\n  - {name: big, nodes: 48}\nrates: {gpu: 100, app: 20}\n"
    )
    runner = CliRunner()
    got = runner.invoke(
        main,
        [
            "simulate",
            "--cluster",
            str(cluster),
            "--days",
            "1",
            "--format",
            "json",
            "--sweep",
            "10m,1h",
            "--policies",
            "slurmedic,oracle",
        ],
    )
    assert got.exit_code == 0, got.output
    out = json.loads(got.stdout)
    assert [o["policy"] for o in out["outcomes"]] == ["slurmedic", "oracle"]
    assert set(out["sweep"]) == {str(timedelta(minutes=10)), str(timedelta(hours=1))}
    assert out["outcomes"][0]["decisions"] > 0
    md = runner.invoke(main, ["simulate", "--cluster", str(cluster), "--days", "1"])
    assert md.exit_code == 0 and "| naive |" in md.output and "ETTR (cluster)" in md.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--policies", "smart"],
            "'smart' is not one of none, naive, slurmedic, slurmedic-norepair, informed, oracle",
        ),
        (["--plot", "x.png"], "a plot needs --sweep"),
        (["--sweep", "0s"], "give durations above 0"),
        (["--nodes", "100"], "the jobs need 1984 nodes, the cluster has 100"),
    ],
)
def test_bad_options_are_one_line_errors(args: list[str], says: str):
    got = CliRunner().invoke(main, ["simulate", "--days", "1", *args])
    assert got.exit_code == 2 and says in got.output


def test_a_bad_cluster_file_names_the_key(tmp_path: Path):
    bad = tmp_path / "cluster.yml"
    bad.write_text("jobs:\n  - {name: big, nodes: 0}\n")
    got = CliRunner().invoke(main, ["simulate", "--cluster", str(bad)])
    assert got.exit_code == 1 and "jobs.0.nodes" in got.output
    unknown = tmp_path / "typo.yml"
    unknown.write_text("nodez: 4\n")
    got = CliRunner().invoke(main, ["simulate", "--cluster", str(unknown)])
    assert got.exit_code == 1 and "nodez: unknown key" in got.output


def test_blips_are_drawn_from_the_seed_apart_from_the_other_failures():
    plain = small(days=3, seed=4, rates={k: v * 20 for k, v in llama3_rates().items()})
    blipping = plain.model_copy(update={"blips": Blips(count=5, nodes=4)})
    drawn = draw(blipping)
    assert drawn == draw(blipping)
    blips = [f for f in drawn if f.kind == "blip"]
    assert len(blips) == 5 and [f for f in drawn if f.kind != "blip"] == draw(plain)
    for f in blips:  # one node a leaf, over every leaf of four; back a minute later
        assert len({n // 16 for n in f.nodes}) == 4 and f.lasts == 60 and f.where == f.nodes[0]
    other = draw(blipping.model_copy(update={"seed": 5}))
    assert [f for f in other if f.kind == "blip"] != blips
    # More nodes than leaves: every leaf one, then a second under some.
    six = draw(plain.model_copy(update={"blips": Blips(count=1, nodes=6)}))
    (f,) = [f for f in six if f.kind == "blip"]
    assert len(set(f.nodes)) == 6 and len({n // 16 for n in f.nodes}) == 4
    # None by default: Llama 3's trace has no published rate of them.
    assert SimConfig().blips.count == 0
    with pytest.raises(ValueError, match="under SlurmdTimeout"):
        Blips(lasts="5m")


def blip_at_a_ping(world: World, after: float, nodes: tuple[int, ...], lasts: float) -> Fault:
    """A blip of `nodes` that starts 10 s before slurmctld's first ping after `after`."""
    return Fault(world._ping(after) - 10, "blip", nodes[0], nodes=nodes, lasts=lasts)


def test_a_blip_shows_its_nodes_not_responding_and_they_come_back():
    # Nodes 5 and 20 run the big job, 50 a small one, 60 nothing.
    world = World(small(), delays())
    responder = Slurmedic(world, load_policy({}))
    blip = blip_at_a_ping(world, 2 * H, (5, 20, 50, 60), 60)
    world.later(blip.at, lambda: world.fail(blip))
    shown: dict[str, dict[str, str]] = {}

    def look(when_: str) -> None:
        shown[when_] = {node_name(i): world.view.nodes[node_name(i)].status for i in blip.nodes}

    world.later(blip.at + 5, partial(look, "before the ping"))
    world.later(blip.at + 11, partial(look, "at the ping"))
    seen: list[Alert] = []
    drive(world, responder, seen)
    assert set(shown["before the ping"].values()) == {""}
    assert shown["at the ping"] == {
        "gpu00006": "allocated*",
        "gpu00021": "allocated*",
        "gpu00051": "allocated*",
        "gpu00061": "idle*",
    }
    # The rules send what they would: SlurmNodeDown for the nodes that run a job, no job label.
    downs = [a.labels for a in seen if a.labels["alertname"] == "SlurmNodeDown"]
    assert sorted(a["node"] for a in downs) == ["gpu00006", "gpu00021", "gpu00051"]
    assert all(a["signal"] == "node_down" and "slurm_job_id" not in a for a in downs)
    assert len(seen) == len(downs)  # nothing else: no job failed, none was marked down
    # Every node answers again at slurmctld's next ping; none was broken.
    assert not any(n.silent or n.broken for n in world.nodes)
    assert world.tally.blips == world.tally.blips_seen == 1
    assert "*" not in "".join(n.status for n in world.view.nodes.values())


def test_the_core_drains_none_of_a_blip_s_nodes_where_the_naive_policy_drains_them():
    cfg = small()
    world = World(cfg, delays())
    blip = blip_at_a_ping(world, 2 * H, (5, 20, 50, 60), 60)
    got = {p: run(cfg, p, [blip]) for p in ("naive", "slurmedic", "oracle")}
    for p, o in got.items():
        t = o.tally
        assert (t.blips, t.blips_seen, t.failures) == (1, 1, 0), p
    ours, oracle, naive = (got[p].tally for p in ("slurmedic", "oracle", "naive"))
    # Three nodes that stop answering on three leaves under two jobs at once: a burst, one
    # shared cause (issue 36). Nothing drained or requeued, one escalation, the other incident
    # waiting with it. The naive policy drains the three healthy nodes (the idle one sent
    # nothing) and requeues the big job and a small one with nothing wrong.
    assert (ours.healthy_drained, ours.blip_drained) == (0, 0)
    assert (ours.needless_requeues, ours.blip_requeues) == (0, 0)
    assert ours.escalations == 1 and got["slurmedic"].guards == {"storm_escalated": 1}
    assert (oracle.drains, oracle.requeues, oracle.blip_drained, oracle.blip_requeues) == (0,) * 4
    assert (naive.blip_drained, naive.blip_requeues) == (3, 2)
    # A blip over before slurmctld pings is not seen at all.
    short = Fault(world._ping(2 * H) + 20, "blip", 5, nodes=(5, 20), lasts=30)
    unseen = run(cfg, "slurmedic", [short]).tally
    assert (unseen.blips, unseen.blips_seen, unseen.alerts, unseen.drains) == (1, 0, 0, 0)


def test_slurmedic_simulate_adds_blips_on_request(tmp_path: Path):
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(
        "nodes: 64\njobs:\n  - {name: big, nodes: 48}\nrates: {gpu: 0}\n"
        "blips: {nodes: 4, lasts: 90s}\n"
    )
    args = ["simulate", "--cluster", str(cluster), "--days", "2", "--policies", "slurmedic"]
    got = CliRunner().invoke(main, [*args, "--blips", "6", "--format", "json"])
    assert got.exit_code == 0, got.output
    out = json.loads(got.stdout)
    assert out["config"]["blips"] == {"count": 6, "nodes": 4, "lasts": "1m30s"}
    (o,) = out["outcomes"]
    assert o["blips"] == 6 and o["blips_seen"] >= 1
    md = CliRunner().invoke(main, [*args, "--blips", "6"])
    assert "Blips: 6," in md.output and "| slurmedic |" in md.output
    none = CliRunner().invoke(main, args)
    assert "Blips" not in none.output
