"""The failure trace: every failure of a simulated span, drawn once from the config's rates and
seed, so that every policy is judged on the same one."""

from __future__ import annotations

import random
from dataclasses import dataclass

from webhook.simulate.model import KINDS, Kind, SimConfig


@dataclass(frozen=True)
class Fault:
    at: float  # seconds from the start
    kind: Kind
    # gpu, node, link: the node (index) it breaks; switch: the leaf (index); app and hang: a
    # node whose job it hits (a failure on an idle node hits nothing).
    where: int
    recurs: bool = False  # app: the bug recurs on every restart until it is fixed ...
    fix_after: float = 0.0  # ... this long after it first crashed the job (its owner's fix)
    gpu: int = 0
    # gpu: the XID its GPU reports (79, off the bus, whatever the cause: what the rules see
    # decides slurmedic's drain and its repair's plan, the cause does not).
    xid: int = 79
    # blip: the nodes (indices) that stop responding, and how long until they answer again.
    nodes: tuple[int, ...] = ()
    lasts: float = 0.0


def leaves(cfg: SimConfig) -> int:
    return -(-cfg.nodes // cfg.leaf_nodes)


def draw(cfg: SimConfig) -> list[Fault]:
    rng = random.Random(cfg.seed)
    per_second = cfg.nodes / 1000 / 86400  # a rate per 1,000 node-days, for this cluster
    faults: list[Fault] = []
    for kind in KINDS:
        rate = cfg.rates.get(kind, 0.0) * per_second
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= cfg.seconds:
                break
            where = rng.randrange(leaves(cfg) if kind == "switch" else cfg.nodes)
            recurs = kind == "app" and rng.random() < cfg.app_recurs
            fix = cfg.human.draw(rng) if recurs else 0.0
            faults.append(Fault(t, kind, where, recurs, fix, rng.randrange(cfg.gpus_per_node)))
    faults += blips(cfg)
    faults.sort(key=lambda f: (f.at, f.kind, f.where))
    return faults


def blips(cfg: SimConfig) -> list[Fault]:
    """The config's blips, from a stream of their own (the other failures are the same with
    them or without): each at a random time, its nodes one a leaf over as many leaves as that
    takes (a leaf's second node once every leaf has one), chosen at random."""
    rng = random.Random(f"{cfg.seed}|blips")
    spec, n_leaves = cfg.blips, leaves(cfg)
    out = []
    for _ in range(spec.count):
        at = rng.uniform(0, cfg.seconds)
        under = [
            rng.sample(
                range(leaf * cfg.leaf_nodes, min((leaf + 1) * cfg.leaf_nodes, cfg.nodes)),
                min(cfg.leaf_nodes, cfg.nodes - leaf * cfg.leaf_nodes),
            )
            for leaf in rng.sample(range(n_leaves), n_leaves)
        ]
        chosen: list[int] = []
        depth = 0
        while len(chosen) < min(spec.nodes, cfg.nodes):
            chosen += [nodes[depth] for nodes in under if depth < len(nodes)]
            depth += 1
        picked = tuple(sorted(chosen[: spec.nodes]))
        out.append(Fault(at, "blip", picked[0], nodes=picked, lasts=spec.lasts.total_seconds()))
    return out
