"""Rule evaluation cost at scale: slurmedic's production rules over up to 16,384 nodes x 8 GPUs.

A real Prometheus scrapes synthetic exporters and evaluates the rendered production rules
(alert_rules/*.rules.yml) every `--interval`; the bench prints what Prometheus itself reports.
Every series a rule group reads is exposed, with the label sets of the real exporters:

- dcgm-exporter (groups slurmedic-gpu, slurmedic-gpu-slow; DCGM_FI_DEV_GPU_UTIL also for
  slurmedic-training, or slurmedic-shard on a shard): the
  lab's fake dcgm-exporter values and labels (UUID, pci_bus_id, device, modelName, Hostname,
  driver, hpc_job), each node with its own `instance` and `up`, as a federating proxy (or a
  per-rack agent) passes them on: 128 nodes per scrape target, `honor_labels`;
- node_exporter's infiniband collector (slurmedic-node): node_infiniband_state_id per HCA port;
- mtail's job-log counters and `_last_timestamp_seconds` gauges (slurmedic-joblog) per
  slurm_job_id, node and rank, with the history an mtail keeps (failed jobs' lines stay);
- what every rank pushes to the Pushgateway (slurmedic-training, slurmedic-goodput), for the
  running jobs and for jobs that ended (their groups stay), one Pushgateway page per 128 nodes;
- a Slurm exporter (slurmedic-slurm: slurm_node_status, slurm_jobs_node_fail, ...) and
  slurmctld's own counts (the slurmctld profile);
- slurmedic's /metrics (slurmedic-self; slurmedic-goodput: slurmedic_job_eligible,
  slurmedic_recoveries_total; slurmedic_node_status for the slurmedic-nodes profile).

Values are healthy but for a few faults of every kind (a share of nodes and jobs that stays
the same at every size), some from the start, some `1.5 x --interval` after Prometheus is up,
so that alerts fire and most stay quiet. Pages are rendered once (gzip, as exporters serve
them) with a small tail rendered per scrape for the faulty few; the Pushgateway pages, whose
step timestamps move, are one template each: the cost measured is Prometheus'.

    .venv/bin/python -m bench.rule_eval [--nodes 2048] [--seconds 120] [--interval 10]
    .venv/bin/python -m bench.rule_eval --nodes 16384 --plan     # series and memory, no run
    .venv/bin/python -m bench.rule_eval --nodes 16384 --shard 0/32 --profile scale  # a shard
    .venv/bin/python -m bench.rule_eval --nodes 16384 --shard global/16 --profile scale  # ruler
    .venv/bin/python -m bench.rule_eval --nodes 16384 --shard jobs:0/4 --profile scale  # training

docs/rule-scale.md has the figures and what they mean.
"""

from __future__ import annotations

import argparse
import gzip
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import yaml
from slurmedic_progress import GAUGES as PUSHED

from lab.config import LabConfig
from lab.dcgm_exporter import (
    COUNTERS,
    GAUGES,
    XID_COUNT,
    XID_WINDOW_S,
    NodeExporter,
    _labels,
    gpu_values,
    xid_counts,
)
from lab.faults import GpuFault
from lab.monitoring import SHARD_JOB
from webhook.rules.render import JOB_GPUS_RECORD, LAYOUTS, RULES_DIR, RuleSource

PORT_BASE = 28000  # below the ephemeral range, clear of the labs (17000, 27000, 30000, 31000)
PAGES_PORT = PORT_BASE + 1  # every synthetic exporter page, by path
PROM_PORT = PORT_BASE + 90
NODES_PER_TARGET = 128
GPUS_PER_NODE = 8
PARTITIONS = ("train", "preempt")  # every node in two overlapping partitions
# HCAs per node: 8 compute rails, one storage port (active), one unused port (never active).
IB_PORTS = tuple(f"mlx5_{i}" for i in range(10))
IB_UNUSED = "mlx5_9"
JOB_ID_BASE, STALE_ID_BASE = 4_100_000, 4_090_000
JOB_SIZES = (1, 2, 4, 8, 16, 32, 64, 8, 4, 2, 1, 16)  # nodes per job, scaled to fill the cluster
BUSY = 0.94  # share of nodes allocated; the rest idle, every third of those drained
NOW = b"@NOW@"  # a template page's placeholder for the scrape's time
# Planning figure for Prometheus 2.x: resident memory per head series (index, labels, open
# chunk, Go's GC headroom), measured figures vary from 2 to 6 KiB with labels and churn.
KIB_PER_SERIES = 6.5  # measured here at 16,384 nodes: 6.1-6.6 KiB a head series
BASE_MIB = 400.0

# The DCGM fields the rules read; the lab's fake exposes 8 more (--full: all of them).
DCGM_READ = (
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_GPU_TEMP",  # GpuMissing
    "DCGM_FI_DEV_GPU_UTIL",  # slurmedic:job:running
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_POWER_VIOLATION",
)
# The pushed gauges the rules read (--full: every gauge a rank pushes, and the Pushgateway's own
# push_time_seconds and push_failure_time_seconds per group).
TRAINING_READ = (
    "training_step_seconds",
    "training_last_step_timestamp_seconds",
    "training_attempt_start_timestamp_seconds",
    "training_last_checkpoint_timestamp_seconds",
)
TRAINING_FULL = (*PUSHED, "push_time_seconds", "push_failure_time_seconds")

# Families by the source a rule group reads; the first pattern that matches a name wins.
FAMILY_GROUPS = (
    ("dcgm", re.compile(r"DCGM_.*")),
    ("node", re.compile(r"node_.*")),
    ("joblog", re.compile(r"training_log_.*")),
    ("training", re.compile(r"training_.*|push_time_seconds|push_failure_time_seconds")),
    ("slurm", re.compile(r"slurm_.*|slurmedic_node_status")),
    ("goodput", re.compile(r"slurmedic_job_.*|slurmedic_recoveries_total")),
    ("slurmedic", re.compile(r"slurmedic_.*")),
    ("recorded", re.compile(r".*:.*")),
    ("alerts", re.compile(r"ALERTS.*")),
    ("scrape", re.compile(r"up|scrape_.*")),
)
# Name prefixes to count Prometheus' series by (one query each, at the end).
COUNT_PREFIXES = (
    "DCGM_",
    "node_",
    "training_",
    "push_",
    "slurm_",
    "slurmedic_",
    "slurmedic:",
    "ALERTS",
    "up",
    "scrape_",
)


NODE_FAULTS = (
    "xid_node",  # XID 79 in the gauge since before the run: GpuXidNodeFault
    "xid_app",  # XID 13 at the fault time: GpuXidApplicationFault, TrainingXidApplicationFault
    "ecc_dbe",  # 2 DBEs, XID 48: GpuDoubleBitEccErrors, GpuXidNodeFault, TrainingGpuHardwareError
    "row_remap",  # GpuUncorrectableRemappedRows, GpuRowRemapFailure
    # Rates over 5m windows: until the window fills, rate() sees a share of it (a run of 30 s,
    # a tenth), hence rates far above the thresholds, so that these are pending early.
    "nvlink",  # 50 CRC flit errors/s (and 12 replays/s) from the start: GpuNvlinkErrors (5m)
    "pcie",  # 500 replays/s from the start: GpuPcieReplays (for 10m)
    "thermal",  # throttled all the time from the start: GpuThrottled (10m; pending from 150 s)
    "gpu_lost",  # a GPU gone from its exporter: GpuMissing, TrainingGpuHardwareError
    "node_down",  # the node dies: SlurmNodeDown, SlurmJobsNodeFail, TrainingNcclTimeout on a peer
    "ib_port",  # a compute rail goes down: NodeInfinibandPortDown (for 1m)
)
JOB_FAULTS = (
    "hang",  # every rank stopped stepping 15 minutes ago: TrainingHang
    "straggler",  # rank 1 at 2.5 x the job's median step time: TrainingStraggler (for 10m)
    "requeued",  # a requeued attempt loading its checkpoint: recovering for goodput
    "oom",
    "cuda_error",
    "nccl_error",
    "task_failed",
    "watchdog",
    "heartbeat",
)
LOG_KIND = {  # a job fault's log line and the rank that prints it
    "oom": ("oom", -1),
    "cuda_error": ("cuda_errors", 0),
    "nccl_error": ("nccl_errors", 2),
    "task_failed": ("task_failures", 0),
    "watchdog": ("watchdog_stuck", 1),
    "heartbeat": ("heartbeat_missed", 0),
}


# --- The cluster ---------------------------------------------------------------------------


@dataclass
class Job:
    id: int
    nodes: list[str]
    fault: str | None = None
    failed: bool = False  # an ended job that failed: its ranks' lines stay in mtail
    eligible: int | None = 1  # slurmedic_job_eligible; None: slurmedic no longer lists it

    def ranks(self, rpn: int) -> Iterable[tuple[int, str]]:
        for i, node in enumerate(self.nodes):
            for local in range(rpn):
                yield i * rpn + local, node


@dataclass(frozen=True)
class LogEvent:
    kind: str  # training_log_<kind>_total / _last_timestamp_seconds
    job: int
    node: str
    rank: int
    at: float | None  # None: at the fault time
    xid: int | None = None


@dataclass
class Cluster:
    nodes: list[str]
    jobs: list[Job]
    stale: list[Job]
    ranks_per_node: int
    full: bool
    t0: float
    job_of: dict[str, Job] = field(default_factory=dict)
    node_fault: dict[str, str] = field(default_factory=dict)
    switch: list[str] = field(default_factory=list)  # nodes a leaf switch cuts off from slurmctld
    drained: set[str] = field(default_factory=set)
    events: list[LogEvent] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    fault_at: float = math.inf  # set once Prometheus scrapes

    def after(self, now: float) -> bool:
        return now >= self.fault_at

    def status(self, node: str, now: float) -> str:
        """sinfo's long state of a node (`*`: slurmctld cannot reach it)."""
        st = "allocated" if node in self.job_of else "drained" if node in self.drained else "idle"
        if self.after(now) and self.node_fault.get(node) == "node_down":
            return "down*"
        if self.after(now) and node in self.switch:
            return st + "*"
        return st

    @property
    def dcgm_fields(self) -> tuple[str, ...]:
        return (*GAUGES, *COUNTERS) if self.full else DCGM_READ

    @property
    def pushed(self) -> tuple[str, ...]:
        return TRAINING_FULL if self.full else TRAINING_READ

    def rank_of(self, node: str, gpu: int) -> int:
        job = self.job_of[node]
        return job.nodes.index(node) * self.ranks_per_node + gpu % self.ranks_per_node

    def targets(self) -> list[list[str]]:
        return [
            self.nodes[i : i + NODES_PER_TARGET]
            for i in range(0, len(self.nodes), NODES_PER_TARGET)
        ]


def _sizes(total: int, count: int) -> list[int]:
    pattern = [JOB_SIZES[j % len(JOB_SIZES)] for j in range(count)]
    scale = total / max(1, sum(pattern))
    return [max(1, round(p * scale)) for p in pattern]


def plan(n_nodes: int, n_jobs: int, n_stale: int, rpn: int, full: bool, t0: float) -> Cluster:
    """Nodes, jobs (one job of a quarter of the cluster from 256 nodes on, the rest of mixed
    sizes) filling 94 % of the nodes, jobs that ended, the faults and the log history."""
    nodes = [f"gpu{i:05d}" for i in range(1, n_nodes + 1)]
    busy = round(BUSY * n_nodes)
    sizes = [n_nodes // 4] if n_nodes >= 256 and n_jobs > 1 else []
    sizes += _sizes(busy - sum(sizes), n_jobs - len(sizes))
    jobs, pos = [], 0
    for j, size in enumerate(sizes):
        if pos >= busy:
            break
        jobs.append(Job(JOB_ID_BASE + j, nodes[pos : min(pos + size, busy)]))
        pos += size
    c = Cluster(nodes, jobs, [], rpn, full, t0)
    c.index = {n: i for i, n in enumerate(nodes)}
    c.job_of = {n: job for job in jobs for n in job.nodes}
    c.drained = {n for i, n in enumerate(nodes) if n not in c.job_of and i % 3 == 0}
    # Jobs that ended, spread over the cluster: their ranks ran where others run now.
    for j, size in enumerate(_sizes(busy // 2, n_stale)):
        start = (j * n_nodes) // max(1, n_stale)
        ran = [nodes[(start + k) % n_nodes] for k in range(size)]
        c.stale.append(
            Job(
                STALE_ID_BASE + j,
                ran,
                failed=j % 2 == 0,
                eligible=0 if j < n_stale // 2 else None,  # ended recently: slurmedic says 0
            )
        )
    # Node faults: every kind at least once, then one fault per 256 nodes.
    stride = max(1, min(256, n_nodes // len(NODE_FAULTS)))
    for i in range(stride // 2, n_nodes, stride):
        c.node_fault[nodes[i]] = NODE_FAULTS[(i // stride) % len(NODE_FAULTS)]
    if n_nodes >= 64:  # a leaf switch: 5 nodes stop answering slurmctld at once
        c.switch = [n for n in nodes[n_nodes // 2 :] if n not in c.node_fault][:5]
    # Job faults: every kind once on small clusters, then one job in 64 (never the big one).
    small = [job for job in jobs if len(job.nodes) < n_nodes // 4] or jobs
    jstride = max(2, min(64, len(small) // len(JOB_FAULTS)))
    for k, job in enumerate(small[jstride // 2 :: jstride]):
        job.fault = JOB_FAULTS[k % len(JOB_FAULTS)]
    c.events = log_events(c)
    return c


def log_events(c: Cluster) -> list[LogEvent]:
    """What mtail has read: the history it keeps (no `del` in the program: every series stays
    until mtail restarts) and the lines the faults print."""
    rpn, out = c.ranks_per_node, []
    for job in c.stale:  # a failed job: every rank timed out and printed its traceback
        if not job.failed:
            continue
        at = c.t0 - 7200
        for rank, node in job.ranks(rpn):
            out += [LogEvent("nccl_timeouts", job.id, node, rank, at)]
            out += [LogEvent("tracebacks", job.id, node, rank, at)]
            if rank % 4 == 0:
                out += [LogEvent("nccl_errors", job.id, node, rank, at)]
        out += [LogEvent("task_failures", job.id, job.nodes[0], 0, at)]
    for j, job in enumerate(c.jobs):
        if j % 10 == 3:  # a warning with a traceback hours ago (a data loader worker restarted)
            out += [LogEvent("tracebacks", job.id, job.nodes[0], 0, c.t0 - 10800)]
        if job.fault == "requeued":  # the previous attempt's failure, 15 minutes ago
            out += [LogEvent("task_failures", job.id, job.nodes[0], 0, c.t0 - 900)]
        if job.fault in LOG_KIND:
            kind, rank = LOG_KIND[job.fault]
            rank = rank % (len(job.nodes) * rpn)
            out += [LogEvent(kind, job.id, job.nodes[rank // rpn], rank, None)]
            out += [LogEvent("tracebacks", job.id, job.nodes[rank // rpn], rank, None)]
    for node, kind in c.node_fault.items():
        if node not in c.job_of:
            continue
        job = c.job_of[node]
        gpu = c.index[node] % GPUS_PER_NODE
        rank = c.rank_of(node, gpu)
        if kind == "xid_node":
            out += [LogEvent("xid", job.id, node, rank, c.t0 - 3600, xid=79)]
        elif kind == "xid_app":
            out += [LogEvent("xid", job.id, node, rank, None, xid=13)]
        elif kind == "ecc_dbe":
            out += [LogEvent("xid", job.id, node, rank, None, xid=48)]
            out += [LogEvent("cuda_ecc_errors", job.id, node, rank, None)]
        elif kind == "gpu_lost":
            out += [LogEvent("gpu_lost", job.id, node, rank, None)]
        elif kind == "node_down" and len(job.nodes) > 1:  # a peer's rank 0 times out
            peer = next(n for n in job.nodes if n != node)
            out += [LogEvent("nccl_timeouts", job.id, peer, job.nodes.index(peer) * rpn, None)]
    # One series per kind, job, node and rank: a line at the fault time supersedes an old one.
    unique: dict[tuple[str, int, str, int, int | None], LogEvent] = {}
    for e in out:
        key = (e.kind, e.job, e.node, e.rank, e.xid)
        if key not in unique or e.at is None:
            unique[key] = e
    return list(unique.values())


# --- Exposition pages ----------------------------------------------------------------------


def family(name: str) -> str:
    return next((g for g, pattern in FAMILY_GROUPS if pattern.fullmatch(name)), "other")


class Exposition:
    """Samples by metric name, in the Prometheus text format."""

    def __init__(self) -> None:
        self.rows: dict[str, list[str]] = defaultdict(list)
        self.kinds: dict[str, str] = {}

    def add(self, name: str, labels: str, value: float | str, kind: str = "gauge") -> None:
        v = value if isinstance(value, str) else format(value, ".15g")
        self.rows[name].append(f"{name}{{{labels}}} {v}" if labels else f"{name} {v}")
        self.kinds.setdefault(name, kind)

    def text(self, types: bool = True) -> str:
        out: list[str] = []
        for name, rows in self.rows.items():
            out += [f"# TYPE {name} {self.kinds[name]}"] if types else []
            out += rows
        return "\n".join(out) + "\n" if out else ""

    def counts(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for name, rows in self.rows.items():
            out[family(name)] += len(rows)
        return out


Tail = Callable[[float], Exposition]


class Page:
    """One target's page: rendered once (gzip, or a template whose `@NOW@` is the scrape's
    time), and a tail rendered at every scrape for the few faulty nodes or jobs."""

    def __init__(self, static: Exposition, tail: Tail | None = None) -> None:
        text = static.text().encode()
        self.counts = static.counts()
        if tail is not None:
            self.counts.update(tail(0.0).counts())
        self.tail = tail
        self.template = text if NOW in text else None
        self.gz = b"" if self.template is not None else gzip.compress(text, compresslevel=1)
        self.size = len(self.template or self.gz)

    def body(self, now: float, gzip_ok: bool) -> tuple[bytes, bool]:
        tail = self.tail(now).text(types=False).encode() if self.tail else b""
        if self.template is not None:
            return self.template.replace(NOW, f"{now:.3f}".encode()) + tail, False
        if gzip_ok:  # gzip members concatenate: Go's reader reads them as one stream
            return self.gz + (gzip.compress(tail, compresslevel=1) if tail else b""), True
        return gzip.decompress(self.gz) + tail, False


def gpu_label_sets(cfg: LabConfig, node: str, job: Job | None) -> list[str]:
    exporter = NodeExporter(cfg, node, None)  # type: ignore[arg-type]
    jid = job.id if job else None
    return [
        _labels([*exporter.gpu_labels(gpu, jid, node), ("instance", f"{node}:9400")])
        for gpu in range(GPUS_PER_NODE)
    ]


def dcgm_rows(
    out: Exposition, c: Cluster, labels: list[str], values: list[dict[str, float]]
) -> None:
    for gpu_labels, v in zip(labels, values, strict=True):
        for name in c.dcgm_fields:
            out.add(name, gpu_labels, v[name], "counter" if name in COUNTERS else "gauge")


def gpu_faults(c: Cluster, node: str, kind: str, gpu: int, now: float) -> list[GpuFault]:
    at = c.fault_at
    if kind == "xid_node":
        return [GpuFault(node=node, gpu=gpu, kind="xid", xid=79, at=c.t0 - 3600)]
    if kind == "nvlink":
        return [GpuFault(node=node, gpu=gpu, kind="nvlink", rate=50.0, at=c.t0 - 60)]
    if kind == "pcie":
        return [GpuFault(node=node, gpu=gpu, kind="pcie", rate=500.0, at=c.t0 - 60)]
    if kind == "thermal":
        return [GpuFault(node=node, gpu=gpu, kind="thermal", at=c.t0 - 60)]
    if not c.after(now):
        return []
    if kind == "xid_app":
        return [GpuFault(node=node, gpu=gpu, kind="xid", xid=13, at=at)]
    if kind == "ecc_dbe":
        return [GpuFault(node=node, gpu=gpu, kind="ecc_dbe", count=2, at=at)]
    if kind == "row_remap":
        return [GpuFault(node=node, gpu=gpu, kind="row_remap_failure", count=1, at=at)]
    return []


def dcgm_page(c: Cluster, cfg: LabConfig, nodes: list[str]) -> Page:
    static, faulty = Exposition(), []
    busy = gpu_values(True, [], c.t0)
    idle = gpu_values(False, [], c.t0)
    for node in nodes:
        if node in c.node_fault:
            faulty.append((node, gpu_label_sets(cfg, node, c.job_of.get(node))))
            continue
        static.add("up", f'instance="{node}:9400"', 1)
        job = c.job_of.get(node)
        labels = gpu_label_sets(cfg, node, job)
        dcgm_rows(static, c, labels, [busy if job else idle] * GPUS_PER_NODE)

    def tail(now: float) -> Exposition:
        out = Exposition()
        for node, labels in faulty:
            kind, busy_ = c.node_fault[node], node in c.job_of
            if kind == "node_down" and c.after(now):
                out.add("up", f'instance="{node}:9400"', 0)
                continue
            out.add("up", f'instance="{node}:9400"', 1)
            bad = c.index[node] % GPUS_PER_NODE
            for gpu, gpu_labels in enumerate(labels):
                if kind == "gpu_lost" and gpu == bad and c.after(now):
                    continue  # fell off the bus
                faults = gpu_faults(c, node, kind, gpu, now) if gpu == bad else []
                dcgm_rows(out, c, [gpu_labels], [gpu_values(busy_, faults, now)])
                for code, n in sorted(xid_counts(faults, now).items()):
                    window = int(XID_WINDOW_S * 1000)
                    extra = f',window_size_in_ms="{window}",xid="{code}"'
                    out.add(XID_COUNT, gpu_labels + extra, n)
        return out

    return Page(static, tail)


def node_page(c: Cluster, nodes: list[str]) -> Page:
    static, faulty = (
        Exposition(),
        [n for n in nodes if c.node_fault.get(n) in ("node_down", "ib_port")],
    )

    def ib(out: Exposition, node: str, down: str | None = None) -> None:
        out.add("up", f'instance="{node}:9100"', 1)
        for dev in IB_PORTS:
            state = 1 if dev in (IB_UNUSED, down) else 4
            out.add(
                "node_infiniband_state_id", f'device="{dev}",instance="{node}:9100",port="1"', state
            )

    for node in nodes:
        if node not in faulty:
            ib(static, node)

    def tail(now: float) -> Exposition:
        out = Exposition()
        for node in faulty:
            if not c.after(now):
                ib(out, node)
            elif c.node_fault[node] == "node_down":
                out.add("up", f'instance="{node}:9100"', 0)
            else:
                ib(out, node, down="mlx5_3")
        return out

    return Page(static, tail)


def _joblog(out: Exposition, e: LogEvent, at: float) -> None:
    labels = f'node="{e.node}",prog="training.mtail",rank="{e.rank}",slurm_job_id="{e.job}"'
    if e.xid is not None:
        labels += f',xid="{e.xid}"'
    out.add(f"training_log_{e.kind}_total", labels, 1, "counter")
    out.add(f"training_log_{e.kind}_last_timestamp_seconds", labels, f"{at:.3f}")


def mtail_page(c: Cluster, by_node: dict[str, list[LogEvent]], nodes: list[str]) -> Page:
    static, recent = Exposition(), []
    for e in (e for node in nodes for e in by_node.get(node, [])):
        if e.at is None:
            recent.append(e)
        else:
            _joblog(static, e, e.at)

    def tail(now: float) -> Exposition:
        out = Exposition()
        for e in recent if c.after(now) else []:
            _joblog(out, e, c.fault_at)
        return out

    return Page(static, tail)


def ranks_by_node(c: Cluster) -> dict[str, list[tuple[Job, int, bool]]]:
    out: dict[str, list[tuple[Job, int, bool]]] = defaultdict(list)
    for job in c.jobs:
        for rank, node in job.ranks(c.ranks_per_node):
            out[node].append((job, rank, False))
    for job in c.stale:
        for rank, node in job.ranks(c.ranks_per_node):
            out[node].append((job, rank, True))
    return out


def training_page(
    c: Cluster, by_node: dict[str, list[tuple[Job, int, bool]]], nodes: list[str]
) -> Page:
    """The groups every rank pushed, as a Pushgateway serves them (`instance=""`)."""
    out = Exposition()
    now = NOW.decode()
    for job, rank, stale in (r for node in nodes for r in by_node.get(node, [])):
        node = job.nodes[rank // c.ranks_per_node]
        labels = f'instance="",job="training",node="{node}",rank="{rank}",slurm_job_id="{job.id}"'
        step_s = (0.8 + 0.1 * (job.id % 7)) * (1 + 0.003 * (rank % 5))
        if job.fault == "straggler" and rank == 1:
            step_s *= 2.5
        v: dict[str, float | str] = {
            "training_step": 20_000 + 37 * (job.id % 100),
            "training_step_seconds": step_s,
            "training_last_step_timestamp_seconds": now,
            "training_last_checkpoint_step": 20_000,
            "training_last_checkpoint_timestamp_seconds": c.t0 - 60 * (1 + job.id % 25),
            "training_attempt": 0,
            "training_attempt_start_timestamp_seconds": c.t0 - 3600 * (1 + job.id % 5),
            "push_time_seconds": now,
            "push_failure_time_seconds": 0,
        }
        if stale or job.fault == "hang":
            then = c.t0 - 7200 - 60 * (job.id % 30) if stale else c.t0 - 900
            v["training_last_step_timestamp_seconds"] = v["push_time_seconds"] = then
        elif job.fault == "requeued":  # PUT replaced the group: only the attempt's start
            v = {
                "training_attempt": 1,
                "training_attempt_start_timestamp_seconds": c.t0 - 30,
                "push_time_seconds": c.t0 - 30,
                "push_failure_time_seconds": 0,
            }
        for name in c.pushed:
            if name in v:
                out.add(name, labels, v[name])
    return Page(out)


def slurm_page(c: Cluster) -> Page:
    """SckyzO/slurm_exporter's names, as lab/slurm_exporter.py serves them."""
    static, faulty = Exposition(), [n for n in c.nodes if n in c.node_fault or n in c.switch]

    def rows(out: Exposition, node: str, st: str) -> None:
        for p in PARTITIONS:
            labels = f'node="{node}",partition="{p}",status="{st}"'
            out.add("slurm_node_status", labels, 1)
            out.add("slurm_node_gres_total", labels + ',gres_type="gpu"', GPUS_PER_NODE)
            used = GPUS_PER_NODE if st.startswith("allocated") else 0
            out.add("slurm_node_gres_used", labels + ',gres_type="gpu"', used)
        if st == "drained":
            out.add(
                "slurm_node_drain_reason_info", f'node="{node}",reason="maintenance: HGX tray"', 1
            )
            out.add("slurm_node_drain_since_timestamp_seconds", f'node="{node}"', c.t0 - 86400)

    for node in c.nodes:
        if node not in faulty:
            rows(static, node, c.status(node, 0.0))
    static.add("slurm_exporter_collector_success", 'collector="slurmctld"', 1)

    def tail(now: float) -> Exposition:
        out = Exposition()
        counts: Counter[str] = Counter()
        for node in faulty:
            rows(out, node, c.status(node, now))
        for node in c.nodes:  # slurm_nodes_<state>: counts per partition, as the exporter's
            st = c.status(node, now)
            bucket = {"allocated": "alloc", "drained": "drain", "idle": "idle"}.get(
                st.rstrip("*"), "down"
            )
            counts[bucket] += 1
        for p in PARTITIONS:
            for s in ("alloc", "comp", "down", "drain", "err", "fail", "idle", "mix", "resv"):
                out.add(f"slurm_nodes_{s}", f'active_feature_set="",partition="{p}"', counts[s])
        out.add("slurm_nodes_total", "", len(c.nodes))
        failed = 1 if c.after(now) and "node_down" in c.node_fault.values() else 0
        jobs = {"running": len(c.jobs), "pending": len(c.jobs) // 3, "node_fail": failed}
        for s in ("running", "pending", "completed", "failed", "node_fail", "cancelled"):
            out.add(f"slurm_jobs_{s}", "", jobs.get(s, 17))
        return out

    return Page(static, tail)


def slurmctld_page(c: Cluster, what: str) -> Page:
    """Slurm 25.11+'s own /metrics/nodes or /metrics/jobs (the slurmctld profile)."""

    def tail(now: float) -> Exposition:
        out = Exposition()
        after = c.after(now)
        down = sum(1 for k in c.node_fault.values() if k == "node_down") if after else 0
        if what == "nodes":
            out.add("slurm_nodes_down", "", down)
            out.add("slurm_nodes_noresp", "", len(c.switch) + down if after else 0)
            out.add("slurm_nodes_alloc", "", len(c.job_of))
            out.add("slurm_nodes_idle", "", len(c.nodes) - len(c.job_of) - len(c.drained))
            out.add("slurm_nodes_drain", "", len(c.drained))
        else:
            out.add("slurm_jobs_node_failed", "", 1 if down else 0)
            out.add("slurm_jobs_running", "", len(c.jobs))
            out.add("slurm_jobs_pending", "", len(c.jobs) // 3)
        return out

    return Page(Exposition(), tail)


def slurmedic_page(c: Cluster) -> Page:
    static = Exposition()
    for job in [*c.jobs, *c.stale]:
        if job.eligible is not None:
            static.add(
                "slurmedic_job_eligible", f'partition="train",slurm_job_id="{job.id}"', job.eligible
            )
            static.add(
                "slurmedic_job_restarts", f'slurm_job_id="{job.id}"', int(job.fault == "requeued")
            )
    faulty = [n for n in c.nodes if n in c.node_fault or n in c.switch]
    for node in c.nodes:
        if node not in faulty:
            st = c.status(node, 0.0)
            for p in PARTITIONS:
                static.add(
                    "slurmedic_node_status", f'node="{node}",partition="{p}",status="{st}"', 1
                )
    static.add("slurmedic_breaker_open", "", 0)
    static.add("slurmedic_monitor_switch", "", 0)
    for action in ("drain", "requeue", "stop", "resume"):
        for outcome, n in (("executed", 12), ("failed", 0)):
            static.add(
                "slurmedic_executor_runs_total",
                f'action="{action}",outcome="{outcome}"',
                n,
                "counter",
            )

    def tail(now: float) -> Exposition:
        out, after = Exposition(), c.after(now)
        out.add("slurmedic_loop_last_tick_timestamp_seconds", "", f"{now - 1:.3f}")
        for outcome, n in (("recovered", 41 + int(after)), ("failed", 3), ("unverified", 2)):
            out.add("slurmedic_recoveries_total", f'outcome="{outcome}"', n, "counter")
        for node in faulty:
            st = c.status(node, now)
            for p in PARTITIONS:
                out.add("slurmedic_node_status", f'node="{node}",partition="{p}",status="{st}"', 1)
        return out

    return Page(static, tail)


def shards_page(c: Cluster, n_shards: int) -> Page:
    """What the shards' job GPU counts (JOB_GPUS_RECORD) give the ruler (--shard global/N)."""
    out = Exposition()
    targets = c.targets()
    shard_of = {n: (t * n_shards) // len(targets) for t, ns in enumerate(targets) for n in ns}
    for job in c.jobs:
        per: Counter[int] = Counter(shard_of[n] for n in job.nodes)
        for shard, count in sorted(per.items()):
            labels = f'shard="{shard}",slurm_job_id="{job.id}"'
            out.add(JOB_GPUS_RECORD, labels, count * GPUS_PER_NODE)
    return Page(out)


# --- What runs where -----------------------------------------------------------------------


@dataclass
class Scope:
    """Which pages a run serves and which rendering (layout) of the rules it evaluates."""

    shard: int | None  # this scrape shard's node-scoped sources, or this training ruler's jobs
    shards: int
    role: str  # all, shard, global, jobs (a training ruler: the jobs whose id is K mod N)

    @classmethod
    def parse(cls, text: str | None) -> Scope:
        if not text:
            return cls(None, 1, "all")
        role, jobs, rest = "shard", text.startswith("jobs:"), text.removeprefix("jobs:")
        k, _, n = rest.partition("/")
        bad = f"--shard {text}: K/N (0 <= K < N), global/N or jobs:K/N"
        if not n.isdigit() or int(n) < 1:
            raise SystemExit(bad)
        if k == "global" and not jobs:
            return cls(None, int(n), "global")
        if not k.isdigit() or int(k) >= int(n):
            raise SystemExit(bad)
        return cls(int(k), int(n), "jobs" if jobs else role)

    def mine(self, c: Cluster) -> Cluster:
        """The cluster as this side's training and goodput sources see it: a training ruler
        (jobs:K/N) has the pushed groups of the jobs whose id is K mod N, as ranks would push
        to the Pushgateway their job id picks."""
        if self.role != "jobs":
            return c
        assert self.shard is not None
        pick = [j for j in c.jobs if j.id % self.shards == self.shard]
        stale = [j for j in c.stale if j.id % self.shards == self.shard]
        return replace(c, jobs=pick, stale=stale)

    def node_targets(self, c: Cluster) -> list[tuple[int, list[str]]]:
        targets = list(enumerate(c.targets()))
        if self.role in ("global", "jobs"):
            return []
        if self.shard is None:
            return targets
        return [(i, t) for i, t in targets if (i * self.shards) // len(targets) == self.shard]

    @property
    def profile(self) -> str | None:
        """The rule rendering's layout profile (alert_rules/config.yml) for this side."""
        return {"all": None, "shard": "shard", "global": "global", "jobs": "global"}[self.role]


def build_pages(c: Cluster, scope: Scope) -> tuple[dict[str, Page], list[dict[str, Any]]]:
    """Every page by path, and the scrape configs that read them."""
    cfg = LabConfig(run_dir=Path(tempfile.gettempdir()))
    pages: dict[str, Page] = {}
    jobs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    honor = {"dcgm", "node", "pushgateway", SHARD_JOB}

    def add(job: str, path: str, instance: str, page: Page) -> None:
        pages[path] = page
        target = f"127.0.0.1:{PAGES_PORT}"
        labels = {"__metrics_path__": path, "instance": instance}
        jobs[job].append({"targets": [target], "labels": labels})

    events: dict[str, list[LogEvent]] = defaultdict(list)
    for e in c.events:
        events[e.node].append(e)
    for i, nodes in scope.node_targets(c):
        add("dcgm", f"/dcgm/{i}", f"dcgm-proxy-{i:03d}:9400", dcgm_page(c, cfg, nodes))
        add("node", f"/node/{i}", f"node-proxy-{i:03d}:9100", node_page(c, nodes))
        add("mtail", f"/mtail/{i}", f"loghost-{i:03d}:3903", mtail_page(c, events, nodes))
    if scope.role != "shard":
        sub = scope.mine(c)
        ranks = ranks_by_node(sub)
        for i, nodes in enumerate(c.targets()):
            page = training_page(sub, ranks, nodes)
            add("pushgateway", f"/push/{i}", f"pushgateway-{i:03d}:9091", page)
        add("slurmedic", "/slurmedic", "slurmedic:8080", slurmedic_page(sub))
    if scope.role in ("all", "global"):  # a training ruler evaluates none of Slurm's rules
        add("slurm", "/slurm", "slurm-exporter:8080", slurm_page(c))
        add("slurmctld-nodes", "/slurmctld/nodes", "slurmctld:6817", slurmctld_page(c, "nodes"))
        add("slurmctld-jobs", "/slurmctld/jobs", "slurmctld:6817", slurmctld_page(c, "jobs"))
    if scope.role == "global":
        add(SHARD_JOB, "/federate", "shards:9090", shards_page(c, scope.shards))
    if scope.role == "jobs":  # its jobs' GPU counts, federated from the scrape shards (32)
        add(SHARD_JOB, "/federate", "shards:9090", shards_page(scope.mine(c), 32))
    configs = [
        {"job_name": job, "honor_labels": job in honor, "static_configs": targets}
        for job, targets in jobs.items()
    ]
    return pages, configs


def estimate(c: Cluster, scope: Scope) -> Counter[str]:
    """Exposed series by family group, from the plan alone (no page is built)."""
    out: Counter[str] = Counter()
    targets = scope.node_targets(c)
    mine = {n for _, nodes in targets for n in nodes}
    out["dcgm"] = len(mine) * GPUS_PER_NODE * len(c.dcgm_fields)
    out["node"] = len(mine) * len(IB_PORTS)
    out["scrape"] = 2 * len(mine) + 5 * 3 * len(targets)  # per-node up of dcgm and node
    out["joblog"] = 2 * sum(1 for e in c.events if e.node in mine)
    if scope.role != "shard":
        sub = scope.mine(c)
        ranks = sum(len(j.nodes) for j in (*sub.jobs, *sub.stale)) * c.ranks_per_node
        out["training"] = ranks * len(c.pushed)
        # status, gres total and used, slurmedic_node_status; drain reasons; the counts
        out["slurm"] = len(c.nodes) * len(PARTITIONS) * 4 + 2 * len(c.drained) + 34
        if scope.role == "jobs":
            out["slurm"] = len(c.nodes) * len(PARTITIONS)  # slurmedic_node_status only
        out["goodput"] = 2 * sum(1 for j in (*sub.jobs, *sub.stale) if j.eligible is not None) + 3
        out["slurmedic"] = 2 + 8 + 1
        out["scrape"] += 5 * (len(c.targets()) + 4)
    return out


# --- Prometheus ----------------------------------------------------------------------------


def serve(pages: dict[str, Page]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            page = pages.get(self.path.split("?")[0])
            if page is None:
                self.send_error(404)
                return
            gzip_ok = "gzip" in self.headers.get("Accept-Encoding", "")
            body, gzipped = page.body(time.time(), gzip_ok)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", PAGES_PORT), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def rule_files(src: Path, out: Path, groups: list[str] | None, layout: str) -> list[str]:
    """The rule files Prometheus loads: the rendered ones of this side's layout as they are,
    or (--groups) copies with only the chosen groups."""
    every = sorted(src.glob("*.rules.yml"))
    files = [p for p in every if p.name in LAYOUTS[layout]]
    if not files:
        raise SystemExit(f"--rules-dir {src}: no *.rules.yml of the {layout} layout")
    if groups is None and files == every:
        return [str(src.resolve() / "*.rules.yml")]
    out.mkdir(parents=True, exist_ok=True)
    kept: list[str] = []
    for path in files:
        doc = yaml.safe_load(path.read_text()) or {}
        chosen = [g for g in doc.get("groups", []) if groups is None or g["name"] in groups]
        kept += [g["name"] for g in chosen]
        if chosen:
            (out / path.name).write_text(yaml.safe_dump({"groups": chosen}, sort_keys=False))
    missing = sorted(set(groups or ()) - set(kept))
    if missing:
        print(f"note: no group named {', '.join(missing)} in {src}")
    return [str(out / "*.rules.yml")]


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


def own_metrics(url: str) -> dict[tuple[str, str], float]:
    """Prometheus' own /metrics: (name, group or "") to value, for the families the bench reads."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith(("prometheus_rule_", "prometheus_tsdb_head_s")):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = m.group(2) or ""
        group = (
            labels.split('rule_group="')[1].split('"')[0].split(";")[-1]
            if "rule_group" in labels
            else ""
        )
        key = (m.group(1), group)
        out[key] = out.get(key, 0.0) + float(m.group(3))  # summed over other labels
    return out


def query(url: str, expr: str, timeout: float = 300) -> list[dict[str, Any]]:
    r = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=timeout).json()
    if r.get("status") != "success":
        raise RuntimeError(f"{expr}: {r.get('error')}")
    result: list[dict[str, Any]] = r["data"]["result"]
    return result


def rss_mib(pid: int | str) -> tuple[float, float]:
    """Resident and peak resident memory of a process, MiB."""
    fields = dict(
        ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in ln
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def mem_available_mib() -> float:
    for ln in Path("/proc/meminfo").read_text().splitlines():
        if ln.startswith("MemAvailable:"):
            return int(ln.split()[1]) / 1024
    return math.inf


def table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        cells = [
            str(v).ljust(w) if i == 0 else str(v).rjust(w)
            for i, (v, w) in enumerate(zip(r, widths, strict=True))
        ]
        print("  ".join(cells))


# --- The run -------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--jobs", type=int, default=None, help="running jobs (default: nodes / 8)")
    p.add_argument("--stale-jobs", type=int, default=None, help="ended jobs (default: jobs / 4)")
    p.add_argument("--ranks-per-node", type=int, default=GPUS_PER_NODE)
    p.add_argument("--seconds", type=int, default=120, help="measured, after Prometheus is up")
    p.add_argument("--interval", type=int, default=10, help="scrape and evaluation interval, s")
    p.add_argument(
        "--warmup", type=float, default=None, help="evaluations left out (default: 1 interval)"
    )
    p.add_argument(
        "--rules-dir",
        "--rules",
        dest="rules_dir",
        type=Path,
        default=RULES_DIR,
        help="directory of rendered *.rules.yml to evaluate (e.g. an older rendering, to compare)",
    )
    p.add_argument(
        "--profile", help="render the templates with these profiles instead (slurmctld,...)"
    )
    p.add_argument("--groups", help="evaluate only these groups (comma-separated names)")
    p.add_argument(
        "--shard",
        help="K/N: scrape shard K of N (profile shard); global/N: the ruler (profile global); "
        "jobs:K/N: a training ruler, the training and goodput rules of the jobs whose id is K "
        "mod N (profile global)",
    )
    p.add_argument(
        "--full", action="store_true", help="also the series no rule reads (all DCGM fields, ...)"
    )
    p.add_argument(
        "--plan", action="store_true", help="print the series and memory estimate, run nothing"
    )
    p.add_argument(
        "--force", action="store_true", help="run even when the estimate exceeds free memory"
    )
    args = p.parse_args()

    scope = Scope.parse(args.shard)
    n_jobs = args.jobs or max(1, args.nodes // 8)
    n_stale = args.stale_jobs if args.stale_jobs is not None else n_jobs // 4
    t0 = time.time()
    c = plan(args.nodes, n_jobs, n_stale, args.ranks_per_node, args.full, t0)
    est = estimate(c, scope)
    est_series = sum(est.values())
    est_mib = BASE_MIB + est_series * KIB_PER_SERIES / 1024
    gpus = args.nodes * GPUS_PER_NODE
    biggest = max((len(j.nodes) for j in c.jobs), default=0)
    print(
        f"{args.nodes:,} nodes x {GPUS_PER_NODE} GPUs ({gpus:,}), {len(c.jobs):,} jobs "
        f"(largest {biggest:,} nodes), {len(c.stale):,} ended, "
        f"{args.ranks_per_node} ranks per node; "
        f"{len(c.node_fault) + len(c.switch)} node faults, "
        f"{sum(1 for j in c.jobs if j.fault)} job faults; scope {scope.role}"
        + (f" {scope.shard}/{scope.shards}" if scope.role in ("shard", "jobs") else "")
        + (
            f": {len(scope.mine(c).jobs):,} jobs, "
            f"{sum(len(j.nodes) for j in scope.mine(c).jobs) * args.ranks_per_node:,} ranks"
            if scope.role == "jobs"
            else ""
        )
    )
    print(
        "estimated exposed series: "
        + ", ".join(f"{k} {v:,}" for k, v in est.most_common() if v)
        + f"; total {est_series:,}"
    )
    print(
        f"estimated Prometheus memory: {est_mib / 1024:.1f} GiB "
        f"({KIB_PER_SERIES:g} KiB per head series + {BASE_MIB:.0f} MiB); "
        f"available {mem_available_mib() / 1024:.1f} GiB; "
        f"samples/s {est_series / args.interval:,.0f}"
    )
    if args.plan:
        return
    if est_mib > 0.8 * mem_available_mib() and not args.force:
        raise SystemExit("the estimate exceeds 80 % of the available memory (--force runs anyway)")

    work = Path(tempfile.mkdtemp(prefix="slurmedic-bench-"))
    rules_src = args.rules_dir
    # A shard or the global ruler evaluates what the product renders for it (profiles shard and
    # global); a --rules-dir of its own is a rendering already, of which a shard or the ruler
    # loads the files of its layout.
    own_dir = args.rules_dir.resolve() != RULES_DIR.resolve()
    if args.profile and own_dir:
        raise SystemExit("--profile renders the templates, --rules-dir reads a rendering: not both")
    profiles = [p for p in (args.profile, scope.profile) if p]
    if profiles and not own_dir:
        rules_src = work / "rendered"
        RuleSource().write(rules_src, ",".join(profiles))
    groups = args.groups.split(",") if args.groups else None
    if scope.role == "jobs" and groups is None:  # what a training ruler evaluates
        groups = ["slurmedic-training", "slurmedic-training-slow", "slurmedic-goodput"]
    layout = scope.profile or "single"
    patterns = rule_files(rules_src, work / "rules", groups, layout)

    b0 = time.time()
    pages, scrape_configs = build_pages(c, scope)
    exposed: Counter[str] = Counter()
    for page in pages.values():
        exposed.update(page.counts)
    served = sum(pg.size for pg in pages.values())
    rss, hwm = rss_mib("self")
    print(
        f"pages: {len(pages)} targets, {sum(exposed.values()):,} series, built in "
        f"{time.time() - b0:.1f}s, {served / 2**20:.0f} MiB held (gzip; Pushgateway pages as "
        f"templates); bench RSS {rss:.0f} MiB, peak {hwm:.0f} MiB"
    )
    server = serve(pages)

    interval = f"{args.interval}s"
    (work / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {
                    "scrape_interval": interval,
                    "evaluation_interval": interval,
                    "scrape_timeout": interval,
                },
                "rule_files": patterns,
                "scrape_configs": scrape_configs,
            }
        )
    )
    log = (work / "prometheus.log").open("w")
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{PROM_PORT}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{PROM_PORT}"
    try:
        measure(args, c, url, prom, exposed, work)
    finally:
        prom.terminate()
        try:
            prom.wait(30)
        except subprocess.TimeoutExpired:
            prom.kill()
        server.shutdown()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def measure(
    args: argparse.Namespace,
    c: Cluster,
    url: str,
    prom: subprocess.Popen[bytes],
    exposed: Counter[str],
    work: Path,
) -> None:
    deadline = time.time() + 120
    while True:
        if prom.poll() is not None:
            sys.exit("prometheus exited:\n" + (work / "prometheus.log").read_text()[-3000:])
        try:
            if requests.get(f"{url}/-/ready", timeout=2).ok:
                break
        except requests.RequestException:
            pass
        if time.time() > deadline:
            sys.exit("prometheus not ready in 120 s")
        time.sleep(0.5)
    ready = time.time()
    c.fault_at = ready + 1.5 * args.interval  # every target scraped once before
    warmup = ready + (args.interval if args.warmup is None else args.warmup)
    end = ready + args.seconds

    durations: dict[str, list[float]] = defaultdict(list)
    group_seen: dict[str, float] = {}
    rule_times: dict[tuple[str, str], list[float]] = defaultdict(list)
    rule_seen: dict[tuple[str, str], str] = {}
    intervals: dict[str, float] = {}
    first: tuple[float, dict[tuple[str, str], float]] | None = None
    last: tuple[float, dict[tuple[str, str], float]] | None = None
    peak_rss = 0.0
    while time.time() < end:
        time.sleep(min(args.interval / 2, max(0.1, end - time.time())))
        if prom.poll() is not None:
            sys.exit("prometheus exited:\n" + (work / "prometheus.log").read_text()[-3000:])
        try:
            own = own_metrics(url)
            groups = requests.get(f"{url}/api/v1/rules", timeout=30).json()["data"]["groups"]
        except requests.RequestException:
            continue
        now = time.time()
        peak_rss = max(peak_rss, rss_mib(prom.pid)[0])
        if now >= warmup:
            first = first or (now, own)
            last = (now, own)
        for (name, group), value in own.items():
            if name != "prometheus_rule_group_last_evaluation_timestamp_seconds" or value <= 0:
                continue
            if group_seen.get(group) != value and value >= warmup:
                durations[group].append(own[("prometheus_rule_group_last_duration_seconds", group)])
            group_seen[group] = value
        for g in groups:
            intervals[g["name"]] = float(g["interval"])
            for r in g["rules"]:
                key = (g["name"], r["name"])
                when = r.get("lastEvaluation", "")
                if rule_seen.get(key) != when and not when.startswith("0001"):
                    if now >= warmup:
                        rule_times[key].append(float(r.get("evaluationTime", 0.0)))
                    rule_seen[key] = when
    report(args, c, url, prom, exposed, durations, intervals, rule_times, first, last, peak_rss)


def report(
    args: argparse.Namespace,
    c: Cluster,
    url: str,
    prom: subprocess.Popen[bytes],
    exposed: Counter[str],
    durations: dict[str, list[float]],
    intervals: dict[str, float],
    rule_times: dict[tuple[str, str], list[float]],
    first: tuple[float, dict[tuple[str, str], float]] | None,
    last: tuple[float, dict[tuple[str, str], float]] | None,
    peak_rss: float,
) -> None:
    own = own_metrics(url)
    head = own.get(("prometheus_tsdb_head_series", ""), 0.0)
    rss, _ = rss_mib(prom.pid)
    peak_rss = max(peak_rss, rss)
    ingest = 0.0
    if first and last and last[0] > first[0]:
        key = ("prometheus_tsdb_head_samples_appended_total", "")
        ingest = (last[1].get(key, 0) - first[1].get(key, 0)) / (last[0] - first[0])
    print(
        f"\nhead series {int(head):,}; Prometheus RSS {rss / 1024:.2f} GiB "
        f"(peak {peak_rss / 1024:.2f} GiB, "
        f"{peak_rss * 1024 / max(head, 1):.1f} KiB per head series); "
        f"samples ingested {ingest:,.0f}/s; evaluation and scrape every {args.interval}s "
        f"for {args.seconds}s"
    )
    fill = min(args.seconds, 600) / 600
    print(
        f"windows hold {fill:.0%} of 10m, {min(args.seconds, 3600) / 3600:.0%} of 1h, "
        f"{args.seconds / 86400:.2%} of 1d: range reads cost more once they are full"
    )

    print("\nrule groups (Prometheus' prometheus_rule_group_last_duration_seconds):")
    rows, total = [], 0.0
    for group in sorted(set(durations) | set(intervals)):
        values = durations.get(group) or [0.0]
        med = statistics.median(values)
        every = intervals.get(group) or own.get(
            ("prometheus_rule_group_interval_seconds", group), 0.0
        )
        total += med
        pct = 100 * med / every if every else 0.0
        missed = own.get(("prometheus_rule_group_iterations_missed_total", group), 0.0)
        failed = own.get(("prometheus_rule_evaluation_failures_total", group), 0.0)
        rows.append(
            (
                group,
                f"{every:g}s",
                f"{med * 1000:.1f}",
                f"{max(values) * 1000:.1f}",
                f"{pct:.1f} %" + (" OVER" if pct > 10 else ""),
                str(len(durations.get(group, []))),
                f"{missed:g}",
                f"{failed:g}",
            )
        )
    rows.append(("all groups", "", f"{total * 1000:.1f}", "", "", "", "", ""))
    table(
        rows,
        ("group", "interval", "median ms", "max ms", "of interval", "evals", "missed", "failed"),
    )

    print("\nthe 10 most expensive rules (median of their evaluations):")
    ranked = sorted(
        ((statistics.median(v), max(v), g, r) for (g, r), v in rule_times.items() if v),
        reverse=True,
    )[:10]
    table(
        [(f"{g} / {r}", f"{med * 1000:.1f}", f"{mx * 1000:.1f}") for med, mx, g, r in ranked],
        ("rule", "median ms", "max ms"),
    )

    in_prom: Counter[str] = Counter()
    for prefix in COUNT_PREFIXES:
        try:
            for r in query(url, f'count by (__name__) ({{__name__=~"{re.escape(prefix)}.*"}})'):
                name = r["metric"]["__name__"]
                if name.startswith(prefix) and not any(
                    name.startswith(q) and len(q) > len(prefix) for q in COUNT_PREFIXES
                ):
                    in_prom[family(name)] += int(float(r["value"][1]))
        except (requests.RequestException, RuntimeError) as e:
            print(f"count of {prefix}*: {e}")
    print("\nseries by family group (exposed by the bench / selected in Prometheus now):")
    groups = [g for g, _ in FAMILY_GROUPS]
    table(
        [
            (g, f"{exposed.get(g, 0):,}", f"{in_prom.get(g, 0):,}")
            for g in groups
            if exposed.get(g) or in_prom.get(g)
        ]
        + [("total", f"{sum(exposed.values()):,}", f"{sum(in_prom.values()):,}")],
        ("family", "exposed", "prometheus"),
    )

    scrape = {
        r["metric"].get("job", ""): float(r["value"][1])
        for r in query(url, "max by (job) (scrape_duration_seconds)")
    }
    print(
        "slowest scrape per job: "
        + ", ".join(f"{job} {s * 1000:.0f} ms" for job, s in sorted(scrape.items()))
    )
    firing = query(url, "count by (alertname, alertstate) (ALERTS)")
    print(
        "alerts: "
        + ", ".join(
            sorted(
                f"{r['metric']['alertname']}={r['value'][1]}"
                + ("" if r["metric"]["alertstate"] == "firing" else " pending")
                for r in firing
            )
        )
    )


if __name__ == "__main__":
    main()
