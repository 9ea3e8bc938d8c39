"""Injected faults: GPU faults read by the fake DCGM exporter, job faults read by the trainer.

Both are small JSON files under the run directory, replaced atomically, so a reader never
sees half a write and `lab inject` needs no connection to a running process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

GpuFaultKind = Literal[
    "xid", "ecc_dbe", "row_remap_failure", "nvlink", "thermal", "pcie", "gpu_lost"
]
SLOW_FACTOR = 3.0  # how many times slower a `slow` rank computes, unless told otherwise
JobFaultKind = Literal[
    "hang", "crash_cuda", "crash_ecc", "crash_nccl", "slow", "timeout_now", "skip_checkpoints"
]

XID_MIN, XID_MAX = 1, 200
OFF_THE_BUS_XIDS = frozenset({79})  # the GPU fell off the bus: nvidia-smi cannot reach it
# What a repair clears: a reboot every GPU fault but a failed row remap (the row stays
# unremappable: the GPU needs replacing); a GPU reset no more, and not on a GPU off the bus
# either (nvidia-smi cannot reset a GPU it cannot see).
RepairKind = Literal["reset", "reboot"]
UNREPAIRABLE: frozenset[str] = frozenset({"row_remap_failure"})
# Faults of a node rather than of a GPU: its health check fails whatever is repaired
# (`diag_fail`), or its reboots never come back (`reboot_hang`); both last until `lab clear`.
NodeFaultKind = Literal["diag_fail", "reboot_hang"]


class GpuFault(BaseModel):
    node: str
    gpu: int = Field(ge=0)
    kind: GpuFaultKind
    at: float
    xid: int | None = Field(default=None, ge=XID_MIN, le=XID_MAX)
    count: int = Field(default=1, ge=1)
    rate: float = Field(default=1.0, gt=0)


def off_the_bus(fault: GpuFault) -> bool:
    return fault.kind == "gpu_lost" or (fault.kind == "xid" and fault.xid in OFF_THE_BUS_XIDS)


def survives(fault: GpuFault, repair: RepairKind) -> bool:
    """Whether `fault` is still there after `repair` of its GPU (a reset) or node (a reboot)."""
    if fault.kind in UNREPAIRABLE:
        return True
    return repair == "reset" and off_the_bus(fault)


class NodeFault(BaseModel):
    node: str
    kind: NodeFaultKind
    at: float


class GpuFaults(BaseModel):
    faults: list[GpuFault] = []
    nodes: list[NodeFault] = []

    def of_node(self, node: str) -> tuple[list[GpuFault], set[NodeFaultKind]]:
        """The node's GPU faults and the kinds of its node faults."""
        return [f for f in self.faults if f.node == node], {
            n.kind for n in self.nodes if n.node == node
        }


class JobFault(BaseModel):
    rank: int = Field(ge=0)
    # The attempt (SLURM_RESTART_COUNT) it hits: the requeued successor runs clean.
    attempt: int = Field(default=0, ge=0)
    kind: JobFaultKind
    at: float
    factor: float = Field(default=SLOW_FACTOR, gt=1.0)


# What a spoiled checkpoint does to the attempt that loads it: `corrupt` restores the step but
# not the weights (its loss is back where training began), `old` loads the newest checkpoint
# written before the spoil was injected (a job whose newer checkpoints did not save; none, when
# it had none): older than any slurmedic can have seen by the time the job fails, however long
# the job trained on after its last read.
SpoilKind = Literal["corrupt", "old"]


class Spoiled(BaseModel):
    attempt: int = Field(ge=0)  # the attempt that resumes from it
    kind: SpoilKind
    before: int | None = Field(default=None, ge=0)  # `old`: a checkpoint before this step


class JobControl(BaseModel):
    faults: list[JobFault] = []
    spoiled: list[Spoiled] = []

    def for_rank(self, rank: int, attempt: int) -> JobFault | None:
        mine = [f for f in self.faults if f.rank == rank and f.attempt == attempt]
        return mine[-1] if mine else None

    def spoiled_for(self, attempt: int) -> Spoiled | None:
        mine = [s for s in self.spoiled if s.attempt == attempt]
        return mine[-1] if mine else None


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f".{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def load_gpu_faults(path: Path) -> GpuFaults:
    try:
        return GpuFaults.model_validate_json(path.read_text())
    except FileNotFoundError:
        return GpuFaults()


def add_gpu_fault(path: Path, fault: GpuFault) -> None:
    with _locked(path):
        state = load_gpu_faults(path)
        state.faults.append(fault)
        _atomic_write(path, state.model_dump_json(indent=1))


def add_node_fault(path: Path, fault: NodeFault) -> None:
    with _locked(path):
        state = load_gpu_faults(path)
        state.nodes.append(fault)
        _atomic_write(path, state.model_dump_json(indent=1))


def clear_gpu_faults(path: Path, node: str | None = None) -> int:
    """Remove the faults of `node` (or all), its node faults too; return how many GPU faults
    were removed."""
    with _locked(path):
        state = load_gpu_faults(path)
        keep = [f for f in state.faults if node is not None and f.node != node]
        nodes = [n for n in state.nodes if node is not None and n.node != node]
        _atomic_write(path, GpuFaults(faults=keep, nodes=nodes).model_dump_json(indent=1))
        return len(state.faults) - len(keep)


def repair_gpu_faults(
    path: Path, node: str, repair: RepairKind, gpus: frozenset[int] | None = None
) -> list[GpuFault]:
    """Remove the faults `repair` clears from `node`'s GPUs (`gpus`, or all); return them."""
    with _locked(path):
        state = load_gpu_faults(path)
        gone = [
            f
            for f in state.faults
            if f.node == node and (gpus is None or f.gpu in gpus) and not survives(f, repair)
        ]
        state.faults = [f for f in state.faults if f not in gone]
        _atomic_write(path, state.model_dump_json(indent=1))
        return gone


def control_path(jobs_dir: Path, job_id: int) -> Path:
    return jobs_dir / str(job_id) / "control.json"


def load_job_control(path: Path) -> JobControl:
    try:
        return JobControl.model_validate_json(path.read_text())
    except (FileNotFoundError, ValueError):
        return JobControl()


def add_job_fault(path: Path, *faults: JobFault) -> None:
    with _locked(path):
        state = load_job_control(path)
        state.faults.extend(faults)
        _atomic_write(path, state.model_dump_json(indent=1))


def add_spoiled(path: Path, spoiled: Spoiled) -> None:
    with _locked(path):
        state = load_job_control(path)
        state.spoiled.append(spoiled)
        _atomic_write(path, state.model_dump_json(indent=1))


def write_json(path: Path, data: dict[str, Any]) -> None:
    _atomic_write(path, json.dumps(data))
