"""What recovery automation is worth on a 16,384-GPU cluster failing as Llama 3's did: the
goodput simulator (webhook/simulate) over 54 days, each policy on the same failure trace,
slurmedic's decisions from its real core.

Prints, per policy: ETTR (cluster and the largest job), GPU-hours lost, healthy nodes drained,
jobs stopped needlessly, escalations, and how long the run took; for slurmedic with the default
policy, with a retry budget sized for the job's failure rate, and with the jobs also asking
for requeues of their own crashes (`retry_application`). Then ETTR by checkpoint interval per
policy, and its PNG; and the spread of ETTR over several failure traces, with `informed` (the
oracle acting on the first alert of each failure) to split slurmedic's gap to the oracle into
what the alerts' own delays cost and what slurmedic's waiting and decisions cost.

    .venv/bin/python -m bench.goodput_sim [--days 54] [--seeds 3] [--plot FILE] [--no-sweep]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

from webhook.core.policy import Policy, load_policy
from webhook.simulate import report
from webhook.simulate.model import KINDS, Delays, SimConfig
from webhook.simulate.plot import ettr_plot
from webhook.simulate.run import Outcome, compare, sweep
from webhook.simulate.site import delays
from webhook.simulate.trace import draw

INTERVALS = ("10m", "20m", "30m", "1h", "2h")
RETRY_APPLICATION = '{"slurmedic": {"retry_application": true}}'
AWAY = "slurmedic, retry_application, requeue_away"
VERIFIED = f"{AWAY}, verify (the recovery check)"
APART = f"{AWAY}, max_hardware_requeues (hardware requeues counted apart)"
INFORMED = "informed: the oracle, on the first alert of each failure"


def sized_budget(cfg: SimConfig, policy: Policy) -> int:
    """Three requeues for each failure the largest job should expect in the budget's window
    (its nodes times the failure rate): the default budget of 3 a day was set for a job that
    fails now and then, not for one that fails every three hours."""
    largest = max(c.nodes for c in cfg.jobs)
    per_node_day = sum(cfg.rates.values()) / 1000
    window_days = policy.retry_budget.window.total_seconds() / 86400
    return max(3, math.ceil(3 * largest * per_node_day * window_days))


def hardware_apart(policy: Policy) -> Policy:
    """`policy` with the requeues for hardware slurmedic blames counted apart, against a budget
    of their own as large as the job's: a crash loop cannot spend what its GPU faults need."""
    rules = policy.retry_budget
    apart = rules.model_copy(update={"max_hardware_requeues": rules.max_requeues})
    return policy.model_copy(update={"retry_budget": apart})


def requeue_away(policy: Policy) -> Policy:
    """`policy` with shared_cause.requeue_away: a job that failed of a shared cause is
    requeued off the nodes it covers at once, not left to a person."""
    shared = policy.shared_cause.model_copy(update={"requeue_away": True})
    return policy.model_copy(update={"shared_cause": shared})


def show(title: str, outcomes: list[Outcome]) -> None:
    print(f"\n## {title}\n")
    print(report.as_markdown(outcomes, "").strip())
    oracle = next((o for o in outcomes if o.policy == "oracle"), None)
    ours = next((o for o in outcomes if o.policy == "slurmedic"), None)
    if oracle is not None and ours is not None:
        gap = (oracle.ettr_cluster - ours.ettr_cluster) / oracle.ettr_cluster
        print(f"\nslurmedic's ETTR is {gap:.1%} below the oracle's")


def seeds(cfg: SimConfig, asking: SimConfig, policy: Policy, waits: Delays, n: int) -> None:
    """One trace is one draw of chance: the same comparison on `n` traces, to show the spread
    (the sized budget; slurmedic also with the jobs asking for application retries)."""
    rows: dict[str, list[float]] = {}
    for seed in range(1, n + 1):
        at = cfg.model_copy(update={"seed": seed})
        for o in compare(at, policy=policy, delays=waits):
            rows.setdefault(o.policy, []).append(o.ettr_cluster)
        retried = compare(
            asking.model_copy(update={"seed": seed}),
            policy=policy,
            delays=waits,
            policies=("slurmedic",),
        )
        rows.setdefault("slurmedic, retry_application", []).append(retried[0].ettr_cluster)
        away = compare(
            asking.model_copy(update={"seed": seed}),
            policy=requeue_away(policy),
            delays=waits,
            policies=("slurmedic",),
        )
        rows.setdefault(AWAY, []).append(away[0].ettr_cluster)
        apart = compare(
            asking.model_copy(update={"seed": seed}),
            policy=hardware_apart(requeue_away(policy)),
            delays=waits,
            policies=("slurmedic",),
        )
        rows.setdefault(APART, []).append(apart[0].ettr_cluster)
        checked = compare(
            asking.model_copy(update={"seed": seed, "verify": True}),
            policy=requeue_away(policy),
            delays=waits,
            policies=("slurmedic",),
        )
        rows.setdefault(VERIFIED, []).append(checked[0].ettr_cluster)
        told = compare(at, policy=policy, delays=waits, policies=("informed",))
        rows.setdefault(INFORMED, []).append(told[0].ettr_cluster)
    oracle = rows["oracle"]
    print(f"\n## ETTR (cluster) over {n} failure traces (seeds 1-{n}), the sized budget\n")
    print("| policy | mean | min | max | mean gap to the oracle |")
    print("|---|---|---|---|---|")
    gaps = {}
    for name, ettr in rows.items():
        gaps[name] = statistics.fmean((o - e) / o for o, e in zip(oracle, ettr, strict=True))
        print(
            f"| {name} | {statistics.fmean(ettr):.4f} | {min(ettr):.4f} | {max(ettr):.4f} "
            f"| {gaps[name]:.1%} |"
        )
    print(
        f"\nOf slurmedic's gap ({AWAY}: {gaps[AWAY]:.2%}), the alerts' own delays (scrape, "
        f"evaluation, `for:`, timeouts, Alertmanager) are {gaps[INFORMED]:.2%}: the oracle "
        f"acting on the first alert of each failure. slurmedic's waiting and decisions are "
        f"the other {gaps[AWAY] - gaps[INFORMED]:.2%}."
    )


def by_kind(cfg: SimConfig, policy: Policy, waits: Delays) -> None:
    """Where slurmedic's gap to the oracle comes from: each kind of failure alone (at three
    times its rate, for a steadier figure), the GPU-minutes of the whole cluster it costs per
    failure beyond the oracle's."""
    print("\n## Where the gap is: each kind of failure alone, 3x its rate\n")
    print(
        "| kind | failures | oracle | slurmedic | cluster-minutes lost per failure beyond the "
        "oracle's | escalations | needless stops |"
    )
    print("|---|---|---|---|---|---|---|")
    gpus = cfg.nodes * cfg.gpus_per_node
    for kind in KINDS:
        rates = {k: (v * 3 if k == kind else 0.0) for k, v in cfg.rates.items()}
        alone = cfg.model_copy(update={"rates": rates})
        faults = draw(alone)
        oracle, ours = compare(
            alone, policy=policy, delays=waits, policies=("oracle", "slurmedic"), faults=faults
        )
        extra = (ours.gpu_hours_lost - oracle.gpu_hours_lost) / max(len(faults), 1)
        print(
            f"| {kind} | {len(faults)} | {oracle.ettr_cluster:.4f} | {ours.ettr_cluster:.4f} "
            f"| {extra / gpus * 60:.1f} | {ours.tally.escalations} | {ours.tally.needless_stops} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=54)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plot", type=Path, default=Path("run/goodput.png"))
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--seeds", type=int, default=3, help="traces for the spread (0: none)")
    ap.add_argument("--by-kind", action="store_true", help="the gap to the oracle by failure kind")
    ap.add_argument(
        "--fabric-error",
        type=float,
        help="seconds from a dead link or leaf to its jobs' NCCL error (default: they hang until "
        "the collective timeout)",
    )
    args = ap.parse_args()
    cfg = SimConfig(days=args.days, seed=args.seed)
    waits = replace(delays(), fabric_error=args.fabric_error)
    faults = draw(cfg)
    print(report.header(cfg, faults, "see each table"))
    if args.fabric_error is None:
        print("- a dead link or leaf: its jobs wait out NCCL's collective timeout\n")
    else:
        print(f"- a dead link or leaf: its jobs' NCCL error after {args.fabric_error:g} s\n")

    began = time.perf_counter()
    default = compare(cfg, policy=Policy(), delays=waits)
    took = time.perf_counter() - began
    show("The default policy", default)
    print("run: " + ", ".join(f"{o.policy} {o.seconds:.1f} s" for o in default))
    gpus = cfg.nodes * cfg.gpus_per_node
    print(f"\nfour policies, {args.days:g} days of {gpus:,} GPUs: {took:.1f} s")

    budget = sized_budget(cfg, Policy())
    sized = load_policy({"retry_budget": {"max_requeues": budget}})
    show(
        f"Retry budget sized for the largest job: {budget} requeues a day",
        compare(cfg, policy=sized, delays=waits, policies=("slurmedic", "oracle")),
    )
    asking = cfg.model_copy(
        update={"jobs": [c.model_copy(update={"comment": RETRY_APPLICATION}) for c in cfg.jobs]}
    )
    best = compare(asking, policy=sized, delays=waits, policies=("slurmedic", "oracle"))
    show(f"... and the jobs ask for requeues of their own crashes ({RETRY_APPLICATION})", best)
    oracle = [o for o in best if o.policy == "oracle"]
    away = compare(asking, policy=requeue_away(sized), delays=waits, policies=("slurmedic",))
    show("... and shared_cause.requeue_away: true", away + oracle)
    apart = compare(
        asking, policy=hardware_apart(requeue_away(sized)), delays=waits, policies=("slurmedic",)
    )
    show(f"... and retry_budget.max_hardware_requeues: {budget}", apart + oracle)

    if args.seeds:
        seeds(cfg, asking, sized, waits, args.seeds)
    if args.by_kind:
        by_kind(asking, sized, waits)
    if args.no_sweep:
        return
    from webhook.core import durations

    intervals = [durations.parse(i) for i in INTERVALS]
    began = time.perf_counter()
    swept = sweep(cfg, intervals, policy=sized, delays=waits)
    print()
    print(report.sweep_markdown(swept).strip())
    print(
        f"\n(budget {budget}; {len(intervals)} intervals x 4 policies: "
        f"{time.perf_counter() - began:.0f} s)"
    )
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    ettr_plot(
        swept,
        [i.total_seconds() / 60 for i in intervals],
        args.plot,
        f"{cfg.nodes * cfg.gpus_per_node:,} GPUs, {args.days:g} days, Llama 3's failures",
    )
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
