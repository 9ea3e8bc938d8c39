"""Fault files: validated, concurrent-safe, attempt-scoped for jobs."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from lab.faults import (
    GpuFault,
    JobControl,
    JobFault,
    add_gpu_fault,
    add_job_fault,
    clear_gpu_faults,
    load_gpu_faults,
    load_job_control,
)


def test_gpu_faults_round_trip_and_clear_per_node(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    add_gpu_fault(path, GpuFault(node="gpu01", gpu=0, kind="xid", xid=79, at=1.0))
    add_gpu_fault(path, GpuFault(node="gpu02", gpu=1, kind="thermal", at=2.0))
    assert [f.node for f in load_gpu_faults(path).faults] == ["gpu01", "gpu02"]
    assert clear_gpu_faults(path, "gpu01") == 1
    assert [f.node for f in load_gpu_faults(path).faults] == ["gpu02"]
    assert clear_gpu_faults(path) == 1
    assert load_gpu_faults(path).faults == []


@pytest.mark.parametrize("bad", [{"xid": 0}, {"xid": 999}, {"gpu": -1}, {"kind": "meltdown"}])
def test_bad_gpu_faults_are_rejected(bad: dict[str, object]) -> None:
    fields: dict[str, object] = {"node": "gpu01", "gpu": 0, "kind": "xid", "xid": 79, "at": 1.0}
    with pytest.raises(ValidationError):
        GpuFault.model_validate({**fields, **bad})


def test_job_faults_hit_only_their_attempt(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    add_job_fault(path, JobFault(rank=1, attempt=0, kind="hang", at=1.0))
    control = load_job_control(path)
    assert control.for_rank(1, 0) is not None
    assert control.for_rank(1, 1) is None  # the requeued successor runs clean
    assert control.for_rank(0, 0) is None


def test_a_corrupt_control_file_means_no_fault(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    path.write_text("{not json")
    assert load_job_control(path) == JobControl()
