"""What recovery automation is worth on a 16,384-GPU cluster failing as Llama 3's did: the
goodput simulator (webhook/simulate) over 54 days, each policy on the same failure trace,
slurmedic's decisions from its real core.

Prints, per policy: ETTR (cluster and the largest job), GPU-hours lost, healthy nodes drained,
jobs stopped and requeued needlessly, escalations, and how long the run took; for slurmedic
with the default policy, and with the jobs also asking for requeues of their own crashes
(`retry_application`) and `shared_cause.requeue_away`, what the default leaves to people. Then
the spread over several failure traces on the default policy: ETTR, its gap to the oracle
(mean, min, max), the tallies, the guards that changed decisions and the GPU-hours lost by
cause against the oracle's in points of ETTR, with `informed` (the oracle acting on the first
alert of each failure) to split slurmedic's gap into what the alerts' own delays cost and what
slurmedic's waiting and decisions cost; with --repairs, slurmedic without its repair loop
too, and each policy's nodes out of service and the cluster's goodput. Then ETTR by checkpoint
interval, and its PNG.

    .venv/bin/python -m bench.goodput_sim [--days 54] [--seeds 3] [--variants] [--repairs]
        [--blips N] [--json FILE] [--plot FILE] [--no-sweep]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from webhook.core.policy import Policy
from webhook.simulate import report
from webhook.simulate.model import KINDS, Delays, SimConfig
from webhook.simulate.plot import ettr_plot
from webhook.simulate.responders import NOREPAIR
from webhook.simulate.run import Outcome, compare, sweep
from webhook.simulate.site import delays
from webhook.simulate.trace import draw

INTERVALS = ("10m", "20m", "30m", "1h", "2h")
RETRY_APPLICATION = '{"slurmedic": {"retry_application": true}}'
RETRIED = "slurmedic, retry_application"
AWAY = "slurmedic, retry_application, requeue_away"
INFORMED = "informed"


def requeue_away(policy: Policy) -> Policy:
    """`policy` with shared_cause.requeue_away: a job that failed of a shared cause is
    requeued off the nodes it covers at once, not left to a person."""
    shared = policy.shared_cause.model_copy(update={"requeue_away": True})
    return policy.model_copy(update={"shared_cause": shared})


def asking(cfg: SimConfig) -> SimConfig:
    """`cfg` with every job asking for requeues of its own crashes."""
    jobs = [c.model_copy(update={"comment": RETRY_APPLICATION}) for c in cfg.jobs]
    return cfg.model_copy(update={"jobs": jobs})


def gap(oracle: Outcome, o: Outcome) -> float:
    return (oracle.ettr_cluster - o.ettr_cluster) / oracle.ettr_cluster


def show(title: str, outcomes: list[Outcome]) -> None:
    print(f"\n## {title}\n")
    print(report.as_markdown(outcomes, "").strip())
    oracle = next((o for o in outcomes if o.policy == "oracle"), None)
    ours = next((o for o in outcomes if o.policy == "slurmedic"), None)
    if oracle is not None and ours is not None:
        print(f"\nslurmedic's ETTR is {gap(oracle, ours):.2%} below the oracle's")


def variants(cfg: SimConfig, waits: Delays, faults: Any) -> dict[str, Outcome]:
    """slurmedic on the default policy, and with what the default leaves to people: the jobs'
    own crashes retried (their comment), and a switch's jobs requeued off it."""
    pol = Policy()
    out = {}
    for name, at, policy in (
        (RETRIED, asking(cfg), pol),
        (AWAY, asking(cfg), requeue_away(pol)),
    ):
        (o,) = compare(at, policy=policy, delays=waits, policies=("slurmedic",), faults=faults)
        out[name] = replace(o, policy=name)
    return out


def seeds(
    cfg: SimConfig, waits: Delays, n: int, *, more: bool, dump: Path | None, repairs: bool = False
) -> None:
    """The default policy on `n` traces (seeds 1..n): the spread of ETTR and of the gap to the
    oracle, and where the gap is (GPU-hours lost by cause against the oracle's)."""
    runs: dict[str, list[Outcome]] = {}
    for seed in range(1, n + 1):
        at = cfg.model_copy(update={"seed": seed})
        faults = draw(at)
        got = compare(
            at,
            policy=Policy(),
            delays=waits,
            policies=("slurmedic", *([NOREPAIR] if repairs else []), "oracle", "informed"),
            faults=faults,
        )
        for o in got:
            runs.setdefault(o.policy, []).append(o)
        if more:
            for name, o in variants(at, waits, faults).items():
                runs.setdefault(name, []).append(o)
        ours, oracle = runs["slurmedic"][-1], runs["oracle"][-1]
        print(
            f"seed {seed}: oracle {oracle.ettr_cluster:.4f}, slurmedic {ours.ettr_cluster:.4f} "
            f"(gap {gap(oracle, ours):.2%}), "
            + ", ".join(
                f"{k} {v[-1].ettr_cluster:.4f} ({gap(oracle, v[-1]):.2%})"
                for k, v in runs.items()
                if k not in ("slurmedic", "oracle")
            ),
            flush=True,
        )
    oracles = runs["oracle"]
    print(f"\n## The default policy over {n} failure traces (seeds 1-{n})\n")
    print(
        "| policy | mean ETTR | min | max | mean gap to the oracle | min gap | max gap | "
        "needless stops | needless requeues | escalations | healthy nodes drained |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, outs in runs.items():
        ettr = [o.ettr_cluster for o in outs]
        gaps = [gap(a, o) for a, o in zip(oracles, outs, strict=True)]
        per = [o.tally for o in outs]
        print(
            f"| {name} | {statistics.fmean(ettr):.4f} | {min(ettr):.4f} | {max(ettr):.4f} "
            f"| {statistics.fmean(gaps):.2%} | {min(gaps):.2%} | {max(gaps):.2%} "
            f"| {sum(t.needless_stops for t in per)} | {sum(t.needless_requeues for t in per)} "
            f"| {sum(t.escalations for t in per)} | {sum(t.healthy_drained for t in per)} |"
        )
    print("\n(needless stops and requeues, escalations, healthy nodes drained: summed over traces)")
    if repairs:
        out_of_service(runs)
    # GPU-hours a point of ETTR is: ETTR is over the jobs' GPUs (spare nodes aside).
    total = cfg.busy_nodes * cfg.gpus_per_node * cfg.seconds / 3600 / 100
    kinds = sorted({k for outs in runs.values() for o in outs for k in o.lost_by_kind})
    beyond = [k for k in runs if k != "oracle"]
    print(
        "\nGPU-hours lost beyond the oracle's, by cause, in points of ETTR (mean over traces; "
        "they add up to the gap in points)\n"
    )
    print("| cause | " + " | ".join(beyond) + " |")
    print("|" + "---|" * (len(beyond) + 1))
    for k in kinds:
        cells = []
        for name in beyond:
            diffs = [
                (o.lost_by_kind.get(k, 0.0) - a.lost_by_kind.get(k, 0.0)) / total
                for a, o in zip(oracles, runs[name], strict=True)
            ]
            cells.append(f"{statistics.fmean(diffs):+.2f}")
        print(f"| {k} | " + " | ".join(cells) + " |")
    for name in beyond:
        said = Counter[str]()
        for o in runs[name]:
            said.update(o.guards)
        if said:
            print(
                f"\n{name}: decisions a guard changed (summed): "
                + ", ".join(f"{g} {c}" for g, c in said.most_common())
            )
    told = statistics.fmean(gap(a, b) for a, b in zip(oracles, runs[INFORMED], strict=True))
    mine = statistics.fmean(gap(a, b) for a, b in zip(oracles, runs["slurmedic"], strict=True))
    print(
        f"\nOf slurmedic's gap ({mine:.2%}), the alerts' own delays (scrape, evaluation, `for:`, "
        f"timeouts, Alertmanager) are {told:.2%}: the oracle acting on the first alert of each "
        f"failure. slurmedic's waiting and decisions are the other {mine - told:.2%}."
    )
    if dump is not None:
        dump.parent.mkdir(parents=True, exist_ok=True)
        dump.write_text(
            json.dumps({k: [o.to_json() for o in v] for k, v in runs.items()}, indent=1)
        )
        print(f"outcomes: {dump}")


def out_of_service(runs: dict[str, list[Outcome]]) -> None:
    """Each policy's nodes out of service and the cluster's goodput, over the traces: what the
    repair loop is worth in capacity."""
    print(
        "\n| policy | mean ETTR | mean cluster goodput | nodes out (mean) | nodes out (peak, "
        "max) | node-hours out (mean) | resets and reboots | nodes repaired | nodes to replace |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, outs in runs.items():
        per = [o.tally for o in outs]
        print(
            f"| {name} | {statistics.fmean(o.ettr_cluster for o in outs):.4f} "
            f"| {statistics.fmean(o.goodput_cluster for o in outs):.4f} "
            f"| {statistics.fmean(o.out_mean for o in outs):.1f} "
            f"| {max(t.out_peak for t in per)} "
            f"| {statistics.fmean(o.out_node_hours for o in outs):,.0f} "
            f"| {sum(t.repairs for t in per)} | {sum(t.repaired for t in per)} "
            f"| {sum(t.replaced for t in per)} |"
        )
    print("\n(resets and reboots, nodes repaired and to replace: summed over traces)")


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
    ap.add_argument("--no-single", action="store_true", help="skip the one-trace tables")
    ap.add_argument("--seeds", type=int, default=3, help="traces for the spread (0: none)")
    ap.add_argument(
        "--variants",
        action="store_true",
        help="over the traces too: slurmedic with retry_application, and with requeue_away",
    )
    ap.add_argument(
        "--repairs",
        action="store_true",
        help="over the traces too: slurmedic without its repair loop, and nodes out of service",
    )
    ap.add_argument("--json", type=Path, help="every trace's outcomes, as JSON, to this file")
    ap.add_argument("--by-kind", action="store_true", help="the gap to the oracle by failure kind")
    ap.add_argument("--blips", type=int, default=0, help="shared blips over the span (default 0)")
    ap.add_argument(
        "--fabric-error",
        type=float,
        help="seconds from a dead link or leaf to its jobs' NCCL error (default: they hang until "
        "the collective timeout)",
    )
    args = ap.parse_args()
    cfg = SimConfig(days=args.days, seed=args.seed)
    if args.blips:
        cfg = cfg.model_copy(update={"blips": cfg.blips.model_copy(update={"count": args.blips})})
    waits = replace(delays(), fabric_error=args.fabric_error)
    faults = draw(cfg)
    print(report.header(cfg, faults, "the defaults (see each table)"))
    if args.fabric_error is None:
        print("- a dead link or leaf: its jobs wait out NCCL's collective timeout\n")
    else:
        print(f"- a dead link or leaf: its jobs' NCCL error after {args.fabric_error:g} s\n")

    if not args.no_single:
        began = time.perf_counter()
        default = compare(cfg, policy=Policy(), delays=waits, faults=faults)
        took = time.perf_counter() - began
        show("The default policy", default)
        print("run: " + ", ".join(f"{o.policy} {o.seconds:.1f} s" for o in default))
        gpus = cfg.nodes * cfg.gpus_per_node
        print(f"\n{len(default)} policies, {args.days:g} days of {gpus:,} GPUs: {took:.1f} s")
        oracle = [o for o in default if o.policy == "oracle"]
        more = variants(cfg, waits, faults)
        show(
            f"... and the jobs ask for requeues of their own crashes ({RETRY_APPLICATION})",
            [replace(more[RETRIED], policy="slurmedic"), *oracle],
        )
        show(
            "... and shared_cause.requeue_away: true",
            [replace(more[AWAY], policy="slurmedic"), *oracle],
        )

    if args.seeds:
        seeds(cfg, waits, args.seeds, more=args.variants, dump=args.json, repairs=args.repairs)
    if args.by_kind:
        by_kind(asking(cfg), Policy(), waits)
    if args.no_sweep:
        return
    from webhook.core import durations

    intervals = [durations.parse(i) for i in INTERVALS]
    began = time.perf_counter()
    swept = sweep(cfg, intervals, policy=Policy(), delays=waits)
    print()
    print(report.sweep_markdown(swept).strip())
    print(
        f"\n(the default policy; {len(intervals)} intervals x {len(next(iter(swept.values())))} "
        "policies: "
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
