"""What `slurmedic simulate` simulates: the cluster, its job mix, the failures it suffers and the
delays between a failure and the alert that reports it. Plain data; the defaults are a
16,384-GPU cluster failing as Llama 3's did (its published figures: docs/simulate.md)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from webhook.core.policy import Duration

# The kinds of failure the simulator draws, each with what the rules see of it:
#   gpu     a GPU fails (XID, ECC, HBM): its rank crashes, the XID rule fires on its node
#   node    the host dies: Slurm marks it down after SlurmdTimeout; the job ends NODE_FAIL
#   link    one node's NIC or cable: its InfiniBand port goes down, the job's collectives stall
#           until their timeout
#   switch  a leaf switch: every node under it loses its port at once (healthy nodes)
#   app     the job's own code crashes on every rank; some bugs recur on every restart
#   hang    a collective hangs with nothing wrong on any node (NCCL watchdog)
# and, drawn apart (`blips`, none by default: no published rate):
#   blip    nodes over many leaves stop responding at the same moment and come back about a
#           minute later (a controller hiccup, a fabric flap, a bad driver rollout): nothing is
#           broken; Slurm shows them not responding, fails no job and marks none down
Kind = Literal["gpu", "node", "link", "switch", "app", "hang", "blip"]
KINDS: tuple[Kind, ...] = ("gpu", "node", "link", "switch", "app", "hang")
# Failures that leave a node broken until it is repaired (the others leave every node healthy).
NODE_FAULTS = frozenset({"gpu", "node", "link"})

# Llama 3 405B: 419 unexpected interruptions in 54 days on 2,048 nodes of 8 H100s, by cause,
# grouped into the kinds above. Silent data corruption (6) raises no alert any rule sees and is
# left out; so is nothing else.
LLAMA3_DAYS = 54
LLAMA3_NODES = 2048
LLAMA3_CAUSES: dict[Kind, dict[str, int]] = {
    "gpu": {
        "faulty GPU": 148,
        "GPU HBM3": 72,
        "GPU SRAM": 19,
        "GPU system processor": 17,
        "GPU thermal": 6,
    },
    "node": {
        "host maintenance": 32,
        "SSD": 3,
        "PSU": 3,
        "chassis": 2,
        "IO board": 2,
        "CPU": 2,
        "system memory": 2,
    },
    # Network switch/cable (35): a cable or port is one node's; leaf switches take the rest.
    "link": {"NIC": 7, "network cable": 25},
    "switch": {"leaf switch": 10},
    "app": {"software bug": 54, "dependency": 2},
    "hang": {"NCCL watchdog": 7},
}


def llama3_rates() -> dict[Kind, float]:
    """Failures per 1,000 node-days by kind (leaf switches too, though one fault takes a leaf)."""
    node_days = LLAMA3_DAYS * LLAMA3_NODES / 1000
    return {kind: sum(c.values()) / node_days for kind, c in LLAMA3_CAUSES.items()}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobClass(_Model):
    """A kind of training job in the mix: how many run, on how many nodes, and their
    checkpointing (each job runs the whole simulated span)."""

    name: str = Field(min_length=1)
    count: int = Field(default=1, ge=1)
    nodes: int = Field(ge=1)
    checkpoint_every: Duration = timedelta(minutes=30)
    checkpoint_write: Duration = timedelta(seconds=30)
    # From the start of an attempt to its first step: scheduling, start-up, loading the
    # checkpoint (ByteRobust: 454 s at 2,048 GPUs, 768 s at 16,384).
    restart: Duration = timedelta(minutes=10)
    # The jobs' Slurm comment: slurmedic's per-job options, e.g.
    # '{"slurmedic": {"retry_application": true}}'.
    comment: str = ""


def _default_jobs() -> list[JobClass]:
    return [
        JobClass(name="pretrain", nodes=1920, restart=timedelta(minutes=13)),
        JobClass(name="finetune", count=8, nodes=8, restart=timedelta(minutes=4)),
    ]


class HumanDelay(_Model):
    """How long a person takes to act on a failure (no automation) or on what slurmedic hands
    them: log-normal, from its median and 90th percentile (nights and weekends are the tail)."""

    median: Duration = timedelta(minutes=30)
    p90: Duration = timedelta(hours=4)

    def draw(self, rng: random.Random) -> float:
        median = self.median.total_seconds()
        spread = max(self.p90.total_seconds() / max(median, 1e-9), 1.0)
        sigma = math.log(spread) / 1.2816  # the 90th percentile of a standard normal
        return median * math.exp(rng.gauss(0.0, sigma))


class AppEveryRank(_Model):
    """The share of the application's crashes that fail every rank alike (each rank's
    traceback), the rest one rank's (its traceback; the job ends, its other ranks killed by the
    launcher). An assumption, not a published figure: docs/operations.md's premise that a bug in the
    code all ranks run fails them alike, and chance (a rank's bad data, an OOM spike, a flaky
    read) fails one. 1.0 and 1.0: every crash on every rank, the model before issue 36."""

    recurs: float = Field(default=0.9, ge=0, le=1)  # of the bugs that recur until fixed
    cured: float = Field(default=0.1, ge=0, le=1)  # of the crashes a restart cures


class Blips(_Model):
    """Shared blips: `count` times over the span (at random times), `nodes` nodes, one a leaf
    over as many leaves as that takes, stop responding at once and come back `lasts` later.
    Shorter than SlurmdTimeout (300 s): Slurm marks none of them down and fails no job."""

    count: int = Field(default=0, ge=0)
    nodes: int = Field(default=12, ge=1)
    lasts: Duration = timedelta(seconds=60)

    @field_validator("lasts")
    @classmethod
    def _shorter_than_slurmd_timeout(cls, v: timedelta) -> timedelta:
        if not timedelta(0) < v < timedelta(seconds=Delays.slurmd_timeout):
            raise ValueError(
                f"must be above 0 and under SlurmdTimeout ({Delays.slurmd_timeout:g} s): a node "
                "silent longer is down, its jobs failed NODE_FAIL (the `node` kind)"
            )
        return v


def _fixes() -> dict[Kind, float]:
    return {"gpu": 0.5, "node": 0.7, "link": 0.2}


class Repairs(_Model):
    """slurmedic's repair loop on a node it drained (webhook.core.repairs decides the plan and
    each step): how long each step takes, and the share of each kind of fault a GPU reset or a
    reboot mends. What it does not mend fails its health check and waits for a person (the
    `repair` or `link_repair` delay, from the drain). docs/simulate.md gives the sources."""

    # `nvidia-smi -r` on an idle node: seconds a GPU (the driver scrubs its memory), a minute
    # with the playbook's run around it.
    reset_gpu: Duration = timedelta(minutes=1)
    # `scontrol reboot` of an 8-GPU node until slurmd registers again: 3-5 minutes for a node,
    # more with an 8-GPU server's POST, driver and fabric manager start (assumed: 10).
    reboot: Duration = timedelta(minutes=10)
    # `dcgmi diag -r 2`: "approximately two minutes" (NVIDIA's dcgmi reference).
    health_check: Duration = timedelta(minutes=2)
    # Of each kind's faults, the share its reset or reboot mends (assumed; docs/simulate.md):
    # gpu: about half (HBM3's uncorrectable errors mostly remapped at the reset, a faulty GPU
    # mostly not), node: Llama 3's host maintenance (32 of 46; SSD, PSU, chassis, IO board,
    # CPU, memory need a person), link: a NIC's firmware now and then, never a cable.
    fixes: dict[Kind, float] = Field(default_factory=_fixes)

    @field_validator("fixes")
    @classmethod
    def _shares(cls, v: dict[Kind, float]) -> dict[Kind, float]:
        for kind, share in v.items():
            if not 0 <= share <= 1:
                raise ValueError(f"{kind}: a share from 0 to 1, not {share}")
        return v


class SimConfig(_Model):
    days: float = Field(default=LLAMA3_DAYS, gt=0)
    nodes: int = Field(default=LLAMA3_NODES, ge=2)
    gpus_per_node: int = Field(default=8, ge=1)
    leaf_nodes: int = Field(default=16, ge=1)  # nodes under one leaf switch
    jobs: list[JobClass] = Field(default_factory=_default_jobs, min_length=1)
    # Failures per 1,000 node-days, by kind (a leaf switch's: per 1,000 node-days of the nodes
    # it serves, so that the mix scales with the cluster).
    rates: dict[Kind, float] = Field(default_factory=llama3_rates)
    # Of the application's crashes, the share that recur on every restart until their owner
    # fixes the code; the rest a restart cures.
    app_recurs: float = Field(default=0.5, ge=0, le=1)
    # ... and of each kind, the share that fail every rank alike (the rest: one rank).
    app_every_rank: AppEveryRank = AppEveryRank()
    # A broken node is back this long after it was taken out of service (a GPU swapped, a
    # host mended, a cable reseated); a leaf switch is mended this long after it failed.
    repair: Duration = timedelta(hours=48)
    link_repair: Duration = timedelta(hours=4)
    switch_repair: Duration = timedelta(hours=1)
    human: HumanDelay = HumanDelay()
    # slurmedic's repair loop (a policy with `repairs.enabled`): its steps' times and what
    # they mend.
    repairs: Repairs = Repairs()
    # Shared blips of many nodes at once (none by default).
    blips: Blips = Blips()
    # slurmedic checks that each requeue it made brought the job back to training: a site that
    # pushes training progress and sets `verification.prometheus_url` (off by default there too).
    verify: bool = False
    seed: int = 1

    @property
    def seconds(self) -> float:
        return self.days * 86400

    @property
    def busy_nodes(self) -> int:
        return sum(c.count * c.nodes for c in self.jobs)


@dataclass(frozen=True)
class Delays:
    """From a failure to its alert at the webhook, as the site's monitoring has it: scrape and
    evaluation intervals, each rule's window and `for:` (alert_rules/config.yml), Slurm's and
    PyTorch's timeouts, and Alertmanager's route to slurmedic (alert_rules/alertmanager.yml)."""

    scrape: float = 15.0
    evaluation: float = 15.0
    group_interval: float = 5.0  # Alertmanager's slurmedic route (group_wait 0s)
    slurmd_timeout: float = 300.0  # Slurm marks a silent node down
    collective_timeout: float = 600.0  # PyTorch's default NCCL timeout
    crash: float = 10.0  # a crashed rank takes the job step down (srun --kill-on-bad-exit)
    ib_port_down_for: float = 60.0
    node_down_for: float = 0.0
    hang_after: float = 600.0
    # A dead link or leaf under a job: None, its ranks wait in a collective until
    # collective_timeout (the conservative model); seconds, NCCL's InfiniBand transport reports
    # the error this soon (NCCL_IB_TIMEOUT 18 is 4.096 us x 2^18 = 1.07 s a try, NCCL_IB_RETRY_CNT
    # 7 retries: about 9 s; PyTorch's watchdog then takes the process down) and the ranks log
    # it (TrainingNcclError). A hang of the job itself still waits the collective timeout.
    fabric_error: float | None = None
    # How long the rules hold an event as evidence (job-log lines, XIDs): joblog_window.
    window: float = 600.0
    # From a requeue to its next attempt's start: the playbook's run, Slurm's requeue (the
    # job's end, its epilog) and the scheduler's next pass.
    requeue_start: float = 60.0
    # A job placed on a node still broken fails again within this long.
    recur_within: float = 300.0

    def fires(self, rng: random.Random, rule_for: float = 0.0) -> float:
        """From a condition being true to its alert firing: the next scrape, the next
        evaluation, the rule's `for:`."""
        return rng.uniform(0, self.scrape) + rng.uniform(0, self.evaluation) + rule_for

    def notifies(self, rng: random.Random) -> float:
        """From an alert firing to the webhook receiving it (Alertmanager's group interval)."""
        return rng.uniform(0, self.group_interval)
