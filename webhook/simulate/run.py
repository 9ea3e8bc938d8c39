"""`slurmedic simulate`'s run: one failure trace, each policy over it in a world of its own, and
what each of them cost (ETTR, GPU-hours, nodes drained for nothing, jobs stopped for nothing).

The loop is replay's: at equal times the world's events (failures, alerts delivered, jobs
ending, nodes mended) come before decisions falling due."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from webhook.core.policy import Policy
from webhook.simulate.model import Delays, SimConfig
from webhook.simulate.responders import COMPARED, Slurmedic, remedy, responder
from webhook.simulate.trace import Fault, draw
from webhook.simulate.world import Tally, World


@dataclass(frozen=True)
class Outcome:
    policy: str
    ettr_cluster: float  # GPU-weighted over every job
    ettr_largest: float  # the largest job's
    # The share of the whole cluster's GPU-hours (idle and out-of-service nodes too) spent on
    # productive (checkpointed) training.
    goodput_cluster: float
    gpu_hours_lost: float  # against the same jobs with no failure (checkpoint writes aside)
    tally: Tally
    decisions: int  # the core's (slurmedic only)
    seconds: float  # wall-clock time the run took
    # The core's decisions a guard changed, by guard (slurmedic only): why it stopped or
    # escalated instead of requeueing.
    guards: dict[str, int] = field(default_factory=dict)
    # GPU-hours lost by the kind of fault that caused the loss (World's Tally.lost): they add
    # up to gpu_hours_lost.
    lost_by_kind: dict[str, float] = field(default_factory=dict)
    # Nodes out of service (drained or down) over the span: on average, and node-hours.
    out_mean: float = 0.0
    out_node_hours: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The figures; not the run's wall-clock time, so that one trace prints the same."""
        out = asdict(self)
        tally = out.pop("tally")
        tally.pop("lost", None)
        tally.pop("out_node_seconds", None)
        out.update(tally)
        del out["seconds"]
        return out


def simulate(
    cfg: SimConfig,
    policy_name: str,
    *,
    policy: Policy | None = None,
    delays: Delays | None = None,
    faults: list[Fault] | None = None,
) -> Outcome:
    began = time.perf_counter()
    world = World(cfg, delays or Delays())
    who = responder(policy_name, world, policy or Policy())
    world.on_alert = who.alert
    world.on_failure = who.failure
    world.on_change = who.changed
    world.on_owner = lambda f, job: remedy(world, f, [(job, job.restarts)], oracle=False)
    for f in faults if faults is not None else draw(cfg):
        world.later(f.at, partial(world.fail, f))
    world.place()
    world.flush()
    end = cfg.seconds
    while True:
        event, due = world.next_event(), who.next_due()
        if event is not None and event <= end and (due is None or event <= due):
            world.step()
        elif due is not None and due <= end:
            world.now = max(world.now, due)
            who.tick()
        else:
            break
    world.now = end
    world.close()
    decided = who.decisions if isinstance(who, Slurmedic) else []
    return Outcome(
        policy=policy_name,
        **_ettr(cfg, world),
        tally=world.tally,
        decisions=len(decided),
        seconds=time.perf_counter() - began,
        guards=dict(Counter(d.guard for d in decided if d.guard).most_common()),
        lost_by_kind=_lost_by_kind(world),
        out_mean=world.tally.out_node_seconds / cfg.seconds,
        out_node_hours=world.tally.out_node_seconds / 3600,
    )


def _lost_by_kind(world: World) -> dict[str, float]:
    hours = {k: v / 3600 for k, v in sorted(world.tally.lost.items())}
    return {k: v for k, v in hours.items() if abs(v) >= 0.5}  # none lost: not a row


def _ettr(cfg: SimConfig, world: World) -> dict[str, float]:
    span = cfg.seconds
    gpu_seconds = sum(j.gpus for j in world.jobs.values()) * span
    productive = sum(j.productive * j.gpus for j in world.jobs.values())
    # The same jobs with no failure: one start-up each, then checkpointed training.
    ideal = sum(
        j.gpus * (span - j.cls.restart.total_seconds()) * j.share for j in world.jobs.values()
    )
    largest = max(world.jobs.values(), key=lambda j: (j.gpus, -j.id))
    return {
        "ettr_cluster": productive / gpu_seconds,
        "goodput_cluster": productive / (cfg.nodes * cfg.gpus_per_node * span),
        "ettr_largest": largest.productive / span,
        "gpu_hours_lost": (ideal - productive) / 3600,
    }


def compare(
    cfg: SimConfig,
    *,
    policy: Policy | None = None,
    delays: Delays | None = None,
    policies: tuple[str, ...] = COMPARED,
    faults: list[Fault] | None = None,
) -> list[Outcome]:
    """Every policy on the same failure trace."""
    faults = draw(cfg) if faults is None else faults
    return [simulate(cfg, p, policy=policy, delays=delays, faults=faults) for p in policies]


def sweep(
    cfg: SimConfig,
    intervals: list[timedelta],
    *,
    policy: Policy | None = None,
    delays: Delays | None = None,
    policies: tuple[str, ...] = COMPARED,
    faults: list[Fault] | None = None,
) -> dict[str, list[Outcome]]:
    """Every policy at each checkpoint interval (every job class's), on one failure trace."""
    faults = draw(cfg) if faults is None else faults
    out = {}
    for every in intervals:
        jobs = [c.model_copy(update={"checkpoint_every": every}) for c in cfg.jobs]
        at = cfg.model_copy(update={"jobs": jobs})
        out[str(every)] = [
            simulate(at, p, policy=policy, delays=delays, faults=faults) for p in policies
        ]
    return out
