"""Rule 5's count, kept as evidence arrives, says what counting all the evidence afresh says: at
every instant, for every node, and in the same words; also when the clock goes back, the
topology changes or evidence is forgotten."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal, getcontext

from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.evidence import Evidence
from webhook.core.policy import FAILURE_RATE, SharedCause
from webhook.core.shared_cause import FailingNodes

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SIGNALS = ("gpu_hw", "node_down", "network", "nccl_timeout", "app_error")


def afresh(
    view: ClusterView,
    evidence: list[Evidence],
    rules: SharedCause,
    now: datetime,
    rate: float = FAILURE_RATE,
) -> tuple[set[str], str, dict[str, tuple[str, ...]]]:
    """Rule 5 counted from all the evidence: the reference."""
    latest: dict[str, datetime] = {}
    for e in evidence:
        if e.node and e.signal in ("gpu_hw", "node_down", "network") and e.actionable:
            latest[e.node] = max(e.starts_at, latest.get(e.node, e.starts_at))
    failing = {n for n, start in latest.items() if start >= now - rules.window}
    shared: set[str] = set()
    why = []
    note = ""  # a burst's words after the window
    away: dict[str, set[str]] = {}
    for switch, members in sorted(view.switches.items()):
        down = failing & set(members)
        if (
            len(down) >= rules.switch_min_nodes
            and len(down) / len(members) >= rules.switch_fraction
        ):
            shared |= down
            why.append(f"{len(down)} of the {len(members)} nodes under switch {switch}")
            for n in down:
                away.setdefault(n, set()).update(members)
    # The jobs that held a node when it failed, whether Slurm has ended them since or not.
    jobs = {j.id for n in failing for j in view.jobs_on(n, latest[n])}
    if (
        len(failing) >= rules.cluster_min_nodes
        and len(failing) >= rules.cluster_fraction * max(1, len(view.nodes))
        and len(jobs) >= 2
    ):
        shared |= failing
        why.append(f"{len(failing)} nodes across {len(jobs)} jobs")
        away = {}  # cluster-wide: no healthy side to move to
    elif burst(view, failing, latest, rules, rate):
        units, leaves, expected = _burst_counts(view, failing, rules, rate)
        on = f" on {len(leaves)} leaf switches" if leaves else ""
        shared |= failing
        count = f"{len(failing)} nodes"
        if len(units) != len(failing):
            count += f" in {len(units)} failures"
        why.append(f"{count}{on}")
        per = f"{rate:.3g} per 1,000 node-days"
        note = f", where this cluster's failure rate ({per}) expects {expected:.1g}"
        away = {}
    window = int(rules.window.total_seconds())
    said = f"{' and '.join(why)} failed within {window}s" if why else ""
    said += note
    return shared, said, {n: tuple(sorted(a)) for n, a in away.items()}


def _qualifying(view: ClusterView, failing: set[str], rules: SharedCause) -> set[str]:
    return {
        s
        for s, members in view.switches.items()
        if len(failing & set(members)) >= rules.switch_min_nodes
        and len(failing & set(members)) / len(members) >= rules.switch_fraction
    }


def _burst_counts(
    view: ClusterView, failing: set[str], rules: SharedCause, rate: float
) -> tuple[set[str], set[str], float]:
    """Independent failures (a failing switch is one), the leaves they are on, and how many
    the cluster's rate expects in the window."""
    qualifying = _qualifying(view, failing, rules)
    units: set[str] = set()
    leaves: set[str] = set()
    for n in failing:
        under = {s for s, members in view.switches.items() if n in members}
        leaves |= under
        units |= {f"switch {s}" for s in under & qualifying} or {n}
    days = rules.window.total_seconds() / 86400
    return units, leaves, len(view.nodes) * rate / 1000 * days


def poisson_tail(count: int, expected: float) -> float:
    """P(X >= count), X ~ Poisson(expected), as one minus the head, in 60 digits."""
    getcontext().prec = 60
    lam = Decimal(expected)
    head = sum(lam**i / math.factorial(i) for i in range(count)) * (-lam).exp()
    return float(1 - head)


def burst(
    view: ClusterView,
    failing: set[str],
    latest: dict[str, datetime],
    rules: SharedCause,
    rate: float,
) -> bool:
    units, leaves, expected = _burst_counts(view, failing, rules, rate)
    return (
        len(units) >= rules.burst_min_nodes
        and poisson_tail(len(units), expected) < rules.burst_chance
        and (not view.switches or len(leaves) >= 2)
    )


def cluster(per_switch: int) -> ClusterView:
    names = [f"n{i:03d}" for i in range(48)]
    v = ClusterView(
        switches={
            f"leaf{i // per_switch}": tuple(names[i : i + per_switch])
            for i in range(0, len(names), per_switch)
        }
    )
    for n in names:
        v.nodes[n] = Node(n, "train")
    for j in range(12):
        # A third of the jobs have failed already, at different times: rule 5 counts those
        # that held a node when it failed.
        ended = T0 + timedelta(seconds=120 * j) if j % 3 == 0 else None
        v.set_job(
            Job(
                id=j,
                nodes=tuple(names[j * 4 : j * 4 + 4]),
                partition="train",
                state="NODE_FAIL" if ended else "RUNNING",
                started=T0 - timedelta(hours=1),
                ended=ended,
            )
        )
    return v


def test_the_kept_count_agrees_with_counting_afresh() -> None:
    rng = random.Random(5)
    rules = SharedCause(
        window=timedelta(minutes=5),
        switch_fraction=0.3,
        switch_min_nodes=2,
        cluster_fraction=0.15,
        cluster_min_nodes=4,
    )
    # Bursts need more failures at a high rate (and none at all under switch_rules).
    switch_rules = rules.model_copy(update={"cluster_min_nodes": 1000, "burst_min_nodes": 1000})
    burst_rules = rules.model_copy(update={"cluster_min_nodes": 1000})
    rates = {id(rules): 3000.0, id(switch_rules): 3000.0, id(burst_rules): FAILURE_RATE}
    view = cluster(per_switch=8)
    failing, evidence = FailingNodes(), []
    now = T0
    checked = shared_seen = switch_only = cluster_wide = bursts = 0
    for step in range(600):
        for _ in range(rng.randrange(3)):
            e = Evidence(
                alertname="A",
                signal=rng.choice(SIGNALS),
                node=rng.choice([*view.nodes, None]),
                job=None,
                fingerprint=f"{step}",
                starts_at=now + timedelta(seconds=rng.uniform(-400, 60)),
                received_at=now,
                problems=() if rng.random() < 0.9 else ("bad",),
            )
            evidence.append(e)
            failing.add(e)
        # Mostly forward, sometimes back (a replay's clock, a restart).
        now += timedelta(seconds=rng.choice([5, 20, 60, -120] if step % 50 else [-600]))
        if step == 300:
            view = cluster(per_switch=12)  # a new topology
        # Every third look, rules under which only a switch can be a shared cause; every third,
        # rules under which a burst is the only cluster-wide one.
        ruled = (rules, switch_rules, burst_rules)[step % 3]
        verdict = failing.at(now, view, ruled, rates[id(ruled)])
        shared, why, away = afresh(view, evidence, ruled, now, rates[id(ruled)])
        assert {n for n in view.nodes if verdict.covers(n)} == shared, step
        assert {n: a for n in view.nodes if (a := verdict.away(n))} == away, step
        if shared:
            assert verdict.reason == why, step
        checked += 1
        shared_seen += bool(shared)
        switch_only += bool(away)
        cluster_wide += bool(shared) and not away
        bursts += "failure rate" in why
    assert checked == 600 and shared_seen > 50  # the shared cause did come up, often
    assert switch_only > 20 and cluster_wide > 20 and bursts > 20  # every kind, each often


def test_forgotten_nodes_no_longer_count() -> None:
    rules = SharedCause(switch_min_nodes=2, switch_fraction=0.2)
    view = cluster(per_switch=8)
    failing = FailingNodes()
    for i, n in enumerate(("n000", "n001", "n002")):
        failing.add(
            Evidence("A", "gpu_hw", n, None, f"{i}", T0, T0),
        )
    assert failing.at(T0, view, rules).covers("n001")
    failing.forget(T0 + timedelta(seconds=1))
    assert failing.latest == {}
    assert not failing.at(T0, view, rules).covers("n001")


def test_jobs_slurm_has_ended_still_count_across_jobs() -> None:
    """Slurm marks a storm's jobs NODE_FAIL before the alerts settle: the storm is still one."""
    rules = SharedCause(cluster_min_nodes=4, cluster_fraction=0.05)
    view = ClusterView(switches={})
    names = [f"n{i:03d}" for i in range(16)]
    for n in names:
        view.nodes[n] = Node(n, "train")
    for j in range(4):
        view.set_job(
            Job(
                id=j,
                nodes=tuple(names[j * 4 : j * 4 + 4]),
                state="NODE_FAIL",
                started=T0 - timedelta(hours=1),
                ended=T0 + timedelta(seconds=30),
            )
        )
    failing = FailingNodes()
    for i, n in enumerate(("n000", "n004", "n008", "n012")):
        failing.add(Evidence("A", "node_down", n, None, f"{i}", T0, T0))
    verdict = failing.at(T0 + timedelta(seconds=60), view, rules)
    assert verdict.jobs == 4 and verdict.covers("n004")
    assert verdict.reason == "4 nodes across 4 jobs failed within 300s"
    # Jobs that had ended before the nodes failed were not hit by it: no storm across jobs.
    later = FailingNodes()
    for i, n in enumerate(("n000", "n004", "n008", "n012")):
        later.add(Evidence("A", "node_down", n, None, f"{i}", T0 + timedelta(minutes=2), T0))
    verdict = later.at(T0 + timedelta(minutes=3), view, rules)
    assert verdict.jobs == 0 and not verdict.cluster_wide
    # Four idle nodes at once are a burst, though (no job to count across: each its own).
    assert verdict.burst and verdict.covers("n004")
    assert verdict.reason.startswith("4 nodes failed within 300s, where this")
    calm = later.at(
        T0 + timedelta(minutes=3), view, rules.model_copy(update={"burst_min_nodes": 5})
    )
    assert not calm.covers("n004")


def test_grew_wide_agrees_with_trying_every_span() -> None:
    """A kept switch verdict's growth check, one pass with a sliding job count, says what
    looking at every span that ends at or after the kept start says."""
    rng = random.Random(11)
    rules = SharedCause(cluster_min_nodes=4, cluster_fraction=0.08)
    view = cluster(per_switch=8)
    span = rules.window
    seen = {True: 0, False: 0}
    for trial in range(200):
        failing = FailingNodes()
        for i in range(rng.randrange(2, 14)):
            start = T0 + timedelta(seconds=rng.uniform(-600, 600))
            failing.add(
                Evidence("A", "node_down", rng.choice(list(view.nodes)), None, f"{i}", start, T0)
            )
        at = T0 + timedelta(seconds=rng.uniform(-300, 300))
        verdict = failing.at(T0 + timedelta(hours=1), view, rules)
        need = max(rules.cluster_min_nodes, rules.cluster_fraction * len(view.nodes))
        expected = False
        for end in failing.latest.values():
            if not at <= end <= at + span:
                continue
            inside = [n for n, s in failing.latest.items() if end - span <= s <= end]
            jobs = {j.id for n in inside for j in view.jobs_on(n, failing.latest[n])}
            expected |= len(inside) >= need and len(jobs) >= 2
        assert verdict.grew_wide(at) == expected, trial
        seen[expected] += 1
    assert seen[True] > 20 and seen[False] > 20  # both answers, often
