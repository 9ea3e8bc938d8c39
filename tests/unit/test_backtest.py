"""The backtest's pure parts: alert spans from ALERTS samples, the scenario a history makes (run
through the real core, as replay runs it), and the comparison with what people did."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from tests.markdown_tables import check
from webhook.backtest import history
from webhook.backtest.compare import AGREE, EXTRA, HANDED, MISS
from webhook.backtest.history import UNKNOWN, Attempt, ClusterShape, NodeEvent, firing_spans
from webhook.backtest.report import as_json, as_markdown, csv_rows
from webhook.backtest.run import Inputs, run

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)
M = timedelta(minutes=1)
H = timedelta(hours=1)


def ts(at: datetime) -> float:
    return at.timestamp()


def samples(first: datetime, last: datetime, every: timedelta) -> list[float]:
    out, t = [], first
    while t <= last:
        out.append(ts(t))
        t += every
    return out


def test_a_gap_of_more_than_two_evaluations_is_a_new_alert_and_the_last_sample_resolves_it():
    labels = {"__name__": "ALERTS", "alertstate": "firing", "alertname": "GpuXidNodeFault"}
    every = 15 * S
    times = samples(T0, T0 + 2 * M, every) + samples(T0 + 5 * M, T0 + 6 * M, every)
    spans = firing_spans([(labels, times)], {"GpuXidNodeFault": every}, M, T0 + H)
    assert [(s.starts_at, s.resolved_at) for s in spans] == [
        (T0, T0 + 2 * M + every),
        (T0 + 5 * M, T0 + 6 * M + every),
    ]
    assert "alertstate" not in spans[0].labels and "__name__" not in spans[0].labels
    # Two samples within two evaluations (one missed evaluation) are the same alert.
    one = firing_spans([(labels, [ts(T0), ts(T0 + 30 * S)])], {}, 15 * S, T0 + H)
    assert len(one) == 1
    # Still firing at the record's end: not resolved.
    open_ = firing_spans([(labels, samples(T0, T0 + M, every))], {}, every, T0 + M)
    assert open_[0].resolved_at is None


def test_an_alert_already_firing_when_the_span_begins_is_left_out():
    labels = {"alertname": "GpuXidNodeFault", "node": "gpu01"}
    every = 15 * S
    span_start = T0 + M
    spans = firing_spans(
        [
            (labels, samples(T0 + 30 * S, T0 + 3 * M, every)),  # fired before the span began
            (labels | {"node": "gpu02"}, samples(span_start, T0 + 3 * M, every)),  # at its start
            (labels | {"node": "gpu03"}, samples(T0 + 2 * M, T0 + 3 * M, every)),
            (labels | {"node": "gpu04"}, samples(T0, T0 + 30 * S, every)),  # over before it
        ],
        {},
        every,
        T0 + H,
    )
    kept, earlier = history.began_in(spans, span_start)
    assert [s.labels["node"] for s in kept] == ["gpu02", "gpu03"]
    assert [s.labels["node"] for s in earlier] == ["gpu01"]


def test_who_took_a_node_out_of_service():
    def ev(reason: str, user: str = "root") -> NodeEvent:
        return NodeEvent("gpu01", T0, None, "DRAIN", reason, user)

    assert ev("slurmedic: 101.0 gpu_hardware").by == "slurmedic"
    assert ev("Not responding").by == "slurm"
    assert ev("bad HBM", "ops").by == "person"
    assert ev("").by == "slurm"
    # A drained node that then stops answering: Slurm's reason added to the person's (seen in
    # the lab under load: the same drain, a new event by root).
    assert ev("bad HBM : Not responding").by == "slurm"
    assert ev("bad HBM : waiting for RMA", "ops").by == "person"


def test_attempts_are_numbered_by_their_start_unless_slurm_gave_their_restart_count():
    a = Attempt(7, UNKNOWN, "j", "u", "p", ("gpu01",), T0, T0 + 2 * H, None, "RUNNING")
    b = Attempt(7, UNKNOWN, "j", "u", "p", ("gpu02",), T0, T0 + H, T0 + 2 * H, "REQUEUED")
    assert [(x.started, x.attempt) for x in history.number_attempts([a, b])] == [
        (T0 + H, 0),
        (T0 + 2 * H, 1),
    ]
    # 24.11+ give each record's restart count: a span that starts after the first run keeps it.
    known = [replace(a, attempt=3), replace(b, attempt=2)]
    assert [x.attempt for x in history.number_attempts(known)] == [2, 3]
    # The same count twice (records older than the release that keeps it): by their order.
    same = [replace(a, attempt=0), replace(b, attempt=0)]
    assert [x.attempt for x in history.number_attempts(same)] == [0, 1]


SHAPE = ClusterShape(
    nodes={f"gpu{i:02d}": ("train", 8) for i in range(1, 9)},
    switches={"leaf1": ("gpu01", "gpu02", "gpu03", "gpu04"),
              "leaf2": ("gpu05", "gpu06", "gpu07", "gpu08")},
)  # fmt: skip


def xid(node: str, job: int, at: datetime, until: datetime) -> tuple[dict[str, str], list[float]]:
    labels = {
        "alertname": "GpuXidNodeFault", "alertstate": "firing", "severity": "critical",
        "signal": "gpu_hw", "node": node, "gpu": "3", "xid": "79", "slurm_job_id": str(job),
    }  # fmt: skip
    return labels, samples(at, until, 15 * S)


def hour() -> Inputs:
    """One scripted hour: a GPU fault the person answers late (a drain 40 min later, the user
    resubmits 3 h later); a node lost that Slurm requeues itself; a drain with no alert; a
    fault alert nobody acts on, on a job that completes."""
    series = [
        xid("gpu02", 101, T0 + 10 * M, T0 + 30 * M),
        xid("gpu07", 103, T0 + 20 * M, T0 + 22 * M),
    ]
    spans = firing_spans(series, {"GpuXidNodeFault": 15 * S}, M, T0 + 4 * H)
    attempts = history.number_attempts([
        Attempt(101, 0, "pretrain", "alice", "train", ("gpu01", "gpu02", "gpu03", "gpu04"),
                T0 - H, T0 - H, T0 + 10 * M + 20 * S, "FAILED", 1),
        Attempt(105, 0, "pretrain", "alice", "train", ("gpu05", "gpu06"),
                T0 + 3 * H + 10 * M, T0 + 3 * H + 11 * M, None, "RUNNING"),
        Attempt(103, 0, "finetune", "bob", "train", ("gpu07", "gpu08"),
                T0 - H, T0 - H, T0 + 50 * M, "COMPLETED", 0),
    ])  # fmt: skip
    events = [
        NodeEvent("gpu02", T0 + 50 * M, None, "DRAIN", "bad HBM", "ops"),
        NodeEvent("gpu06", T0 + 30 * M, T0 + 40 * M, "DRAIN", "cable check", "ops"),
    ]
    return Inputs(spans, attempts, events, SHAPE, [])


def test_the_real_core_over_a_scripted_hour_compared_with_what_people_did():
    report, scenario = run(
        hour(), start=T0, until=T0 + 4 * H, policy=None, delay=0 * S, window=24 * H
    )
    assert scenario["events"], "the history made no events"
    by_incident = {r.incident: r for r in report.incidents}
    fault = by_incident["101.0"]
    verdicts = {(v.action, v.nodes): v for v in fault.verdicts}
    drain = verdicts[("drain", ("gpu02",))]
    assert drain.kind == AGREE and "ops drained it: bad HBM" in drain.note
    # slurmedic decides a settle window after the alert; the person drained 40 min after it.
    assert 35 * M < drain.gained < 41 * M
    requeue = verdicts[("requeue", ())]
    assert requeue.kind == AGREE and "resubmitted" in requeue.note
    assert requeue.gained is not None and 2.5 * H < requeue.gained < 3.1 * H
    # 4 nodes of 8 GPUs idle for that long.
    assert requeue.gpu_hours is not None
    assert abs(requeue.gpu_hours - 32 * requeue.gained.total_seconds() / 3600) < 0.01
    # The fault nobody acted on: its job completed, the node stayed in service. The default
    # breaker (one drain an hour) gives its drain to a person; its requeue nobody made.
    quiet = by_incident["103.0"]
    kinds = {(v.kind, v.action, v.nodes) for v in quiet.verdicts}
    assert kinds == {(HANDED, "escalate", ("gpu07",)), (EXTRA, "requeue", ())}
    assert "nobody took it out" in next(v.note for v in quiet.verdicts if v.kind == HANDED)
    # The drain no alert explains is a miss of its own.
    assert [u.happened.nodes for u in report.unanswered] == [("gpu06",)]
    counts = report.counts()
    assert counts["misses"] == 1 and counts["agreed"] >= 2
    assert counts["gpu_hours_saved"] > 0


def test_a_person_who_drained_what_slurmedic_left_alone_is_a_miss():
    inputs = hour()
    # gpu03 belonged to the failed job too; a person drains it, slurmedic named gpu02 only.
    inputs.events.append(NodeEvent("gpu03", T0 + 55 * M, None, "DRAIN", "reseat", "ops"))
    report, _ = run(inputs, start=T0, until=T0 + 4 * H, policy=None, delay=0 * S, window=24 * H)
    fault = next(r for r in report.incidents if r.incident == "101.0")
    assert any(v.kind == MISS and v.nodes == ("gpu03",) for v in fault.verdicts)


def test_a_looser_breaker_drains_what_nobody_drained_a_possible_false_positive():
    report, _ = run(
        hour(), start=T0, until=T0 + 4 * H, policy={"breaker": {"max_fraction": 0.5}},
        delay=0 * S, window=24 * H,
    )  # fmt: skip
    quiet = next(r for r in report.incidents if r.incident == "103.0")
    assert (EXTRA, "drain", ("gpu07",)) in {(v.kind, v.action, v.nodes) for v in quiet.verdicts}
    assert report.counts()["escalated"] == 0


def test_a_person_who_drained_before_slurmedic_would_have_agrees_and_was_first():
    inputs = hour()
    # The person drains gpu02 5 s after its alert, inside slurmedic's settle window: the core
    # finds it drained (guard already_drained) and leaves the drain to them.
    inputs.events[0] = NodeEvent("gpu02", T0 + 10 * M + 5 * S, None, "DRAIN", "bad HBM", "ops")
    report, _ = run(inputs, start=T0, until=T0 + 4 * H, policy=None, delay=0 * S, window=24 * H)
    fault = next(r for r in report.incidents if r.incident == "101.0")
    assert any(d.guard == "already_drained" for d in fault.decisions)
    (drain,) = [v for v in fault.verdicts if v.action == "drain"]
    assert drain.kind == AGREE and "drained it first" in drain.note
    assert drain.gained is not None and drain.gained < 0 * S


def test_the_report_renders_in_every_format():
    report, _ = run(hour(), start=T0, until=T0 + 4 * H, policy=None, delay=0 * S, window=24 * H)
    report.limits = ["alert annotations are not kept"]
    md = as_markdown(report)
    assert "### 101.0" in md and "bad HBM" in md and "alert annotations are not kept" in md
    (counts,) = check(md)
    assert counts[1][0] == "incidents" and len(counts) == 10
    data = as_json(report)
    assert data["counts"]["incidents"] == len(report.incidents)
    assert {i["incident"] for i in data["incidents"]} >= {"101.0", "103.0"}
    rows = csv_rows(report)
    assert rows[0][0] == "incident" and any(r[4] == "drained" for r in rows[1:])


def test_a_job_that_asked_not_to_be_restarted_is_not_requeued_in_the_backtest():
    """Accounting's exit code reaches the core: job 101 ended with NVRx's 93, so its node is
    drained as the person did, but no requeue is proposed."""
    inputs = hour()
    attempts = [replace(a, exit_code=93) if a.job == 101 else a for a in inputs.attempts]
    report, scenario = run(
        replace(inputs, attempts=attempts), start=T0, until=T0 + 4 * H, policy=None,
        delay=0 * S, window=24 * H,
    )  # fmt: skip
    ends = [j for e in scenario["events"] for j in e.get("cluster", {}).get("jobs", [])]
    assert {"id": 101, "state": "FAILED", "exit_code": 93} in [
        {k: j[k] for k in ("id", "state", "exit_code") if k in j} for j in ends
    ]
    fault = next(r for r in report.incidents if r.incident == "101.0")
    actions = {v.action for v in fault.verdicts}
    assert "drain" in actions and "requeue" not in actions, fault.verdicts
