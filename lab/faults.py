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


class GpuFault(BaseModel):
    node: str
    gpu: int = Field(ge=0)
    kind: GpuFaultKind
    at: float
    xid: int | None = Field(default=None, ge=XID_MIN, le=XID_MAX)
    count: int = Field(default=1, ge=1)
    rate: float = Field(default=1.0, gt=0)


class GpuFaults(BaseModel):
    faults: list[GpuFault] = []


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


def clear_gpu_faults(path: Path, node: str | None = None) -> int:
    """Remove the faults of `node` (or all); return how many were removed."""
    with _locked(path):
        state = load_gpu_faults(path)
        keep = [f for f in state.faults if node is not None and f.node != node]
        _atomic_write(path, GpuFaults(faults=keep).model_dump_json(indent=1))
        return len(state.faults) - len(keep)


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
