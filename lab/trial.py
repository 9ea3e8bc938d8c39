"""A trial of every injectable fault, in the lab, for the console: each fault in turn on a
training job of its own, and what slurmedic recommended for it, ready to be judged.

`slurmedic lab trial` needs the lab up and slurmedic served (`slurmedic lab serve`, monitor
mode by default: nothing reaches Slurm). For each fault it submits a job, waits until it trains
(its GPUs mapped, a first checkpoint written), injects the fault, collects the decisions about
that job and node until none is added for a while, then cancels the job, heals the cluster
and waits until no alert of that fault is left (its windows passed), so no fault's evidence
reaches the next one's job.
Judging is left to the operator: the console lists every incident, `slurmedic trial report`
sums the verdicts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lab import api, manage
from lab.config import LabConfig
from lab.faults import SLOW_FACTOR
from lab.slurm import LabError, node_states, slurm
from webhook.core.cluster import ENDED_STATES
from webhook.ledger.schema import DecisionRow
from webhook.ledger.store import Ledger
from webhook.service.config import load_config


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    inject: Callable[[LabConfig, int, list[str]], str]  # returns the node it hits


def _gpu(kind: str, **kw: object) -> Callable[[LabConfig, int, list[str]], str]:
    def inject(cfg: LabConfig, job: int, nodes: list[str]) -> str:
        manage.inject_gpu(cfg, kind, nodes[1], 3, **kw)  # type: ignore[arg-type]
        return nodes[1]

    return inject


def _job(kind: str) -> Callable[[LabConfig, int, list[str]], str]:
    def inject(cfg: LabConfig, job: int, nodes: list[str]) -> str:
        manage.inject_job(cfg, kind, job, 1)  # type: ignore[arg-type]
        return nodes[1]

    return inject


def _node_down(cfg: LabConfig, job: int, nodes: list[str]) -> str:
    manage.kill_node(cfg, nodes[1])
    return nodes[1]


FAULTS = (
    Fault("xid79", "XID 79: the GPU fell off the bus", _gpu("xid", xid=79)),
    Fault("xid13", "XID 13: a graphics engine exception (the application's)", _gpu("xid", xid=13)),
    Fault("ecc_dbe", "double-bit ECC errors (XID 48)", _gpu("ecc_dbe", count=2)),
    Fault("row_remap", "a failed row remap", _gpu("row_remap_failure")),
    Fault("nvlink", "NVLink CRC errors that keep rising", _gpu("nvlink", rate=50.0)),
    Fault("pcie", "PCIe replays that keep rising", _gpu("pcie", rate=100.0)),
    Fault("thermal", "sustained thermal violation", _gpu("thermal")),
    Fault("gpu_lost", "the GPU disappears from the exporter", _gpu("gpu_lost")),
    Fault("node_down", "the node's slurmd and its tasks killed", _node_down),
    Fault("hang", "rank 1 hangs silently, the others time out in NCCL", _job("hang")),
    Fault("crash_cuda", "rank 1 dies with a CUDA illegal memory access", _job("crash_cuda")),
    Fault("crash_ecc", "rank 1 dies with a CUDA uncorrectable ECC error", _job("crash_ecc")),
    Fault("crash_nccl", "rank 1 dies with the NCCL watchdog's lines", _job("crash_nccl")),
    Fault("slow", f"rank 1 computes {SLOW_FACTOR:g} times slower (a straggler)", _job("slow")),
)


@dataclass
class Outcome:
    fault: Fault
    job: int
    node: str
    decisions: list[DecisionRow] = field(default_factory=list)


def _wait(probe: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.5)
    raise LabError(f"trial: timed out waiting for {what}")


def _trains(cfg: LabConfig, job: int) -> list[str]:
    def running() -> list[str]:
        try:
            return manage.running_job(cfg, job)[0]
        except LabError:
            return []

    nodes: list[str] = _wait(running, 120, f"job {job} running")  # type: ignore[assignment]
    _wait(
        lambda: api.query(cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}'),
        60,
        f"job {job}'s GPUs mapped",
    )
    ckpt = f'min(training_last_checkpoint_step{{slurm_job_id="{job}"}}) >= 5'
    _wait(lambda: api.query(cfg, ckpt), 120, f"job {job}'s first checkpoint")
    return nodes


def _ours(row: DecisionRow, job: int, node: str) -> bool:
    return row.job == job or (row.job is None and node in (*row.nodes, *row.incident.split(":")))


def _collect(
    ledger: Ledger, after: int, job: int, node: str, quiet: float, limit: float
) -> list[DecisionRow]:
    """The decisions about the job or the node since `after`, once none has been added for
    `quiet` seconds (or `limit` passed)."""
    start, last_change, seen = time.monotonic(), time.monotonic(), 0
    found: list[DecisionRow] = []
    while time.monotonic() - start < limit:
        found = [r for r in ledger.decisions(500) if r.id > after and _ours(r, job, node)]
        if len(found) != seen:
            seen, last_change = len(found), time.monotonic()
        if found and time.monotonic() - last_change >= quiet:
            break
        time.sleep(0.5)
    return sorted(found, key=lambda r: r.id)


def _heal(cfg: LabConfig, job: int) -> None:
    slurm(cfg, "scancel", str(job), check=False)
    _wait(lambda: manage.show_job(cfg, job).get("JobState") in ENDED_STATES, 60, f"job {job} ended")
    manage.clear(cfg)
    _wait(
        lambda: not any(s.endswith("*") for s in node_states(cfg).values()),
        90,
        "every node answering",
    )
    for node, state in node_states(cfg).items():
        if state.startswith(("drain", "down")):
            slurm(cfg, "scontrol", "update", f"nodename={node}", "state=resume", check=False)


def _quiet(cfg: LabConfig, timeout: float = 600.0) -> None:
    """Until no alert for slurmedic fires or is pending: a fault's alerts outlive it (windowed
    rules hold evidence for minutes), and in monitor mode nothing is drained, so the next job
    would land on the same node and inherit the last fault's evidence."""
    _wait(
        lambda: not api.query(cfg, 'ALERTS{signal!=""}'), timeout, "the last fault's alerts to end"
    )


def run(
    cfg: LabConfig,
    names: list[str] | None = None,
    *,
    quiet: float = 15.0,
    limit: float = 150.0,
    progress: Callable[[Outcome], None] = lambda _o: None,
) -> list[Outcome]:
    ledger = Ledger(load_config(cfg.slurmedic_config).database_url)
    faults = [f for f in FAULTS if names is None or f.name in names]
    outcomes = []
    for fault in faults:
        _quiet(cfg)
        job = manage.submit_training(cfg, nodes=3, step_time=0.2, ckpt_every=5, nccl_timeout=8.0)
        try:
            nodes = _trains(cfg, job)
            after = max((r.id for r in ledger.decisions(1)), default=0)
            node = fault.inject(cfg, job, nodes)
            outcome = Outcome(fault, job, node, _collect(ledger, after, job, node, quiet, limit))
        finally:
            _heal(cfg, job)
        outcomes.append(outcome)
        progress(outcome)
    return outcomes
