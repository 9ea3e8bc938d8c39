"""The session's lab: a real Slurm cluster and monitoring stack on ports 27xxx, in a temp dir.

It is brought up once for all lab tests and torn down at the end, leaving nothing running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from lab import api, manage
from lab.config import LabConfig
from lab.slurm import slurm

T = TypeVar("T")
TEST_PORT_BASE = 27000


@pytest.fixture(scope="session")
def lab_cfg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabConfig]:
    cfg = LabConfig(run_dir=tmp_path_factory.mktemp("lab"), port_base=TEST_PORT_BASE)
    try:
        manage.up(cfg)
        yield cfg
    finally:
        manage.down(cfg)


@pytest.fixture
def submit(lab_cfg: LabConfig) -> Iterator[Callable[..., int]]:
    """Submit training jobs for one test; they are cancelled when it ends."""
    jobs: list[int] = []

    def _submit(**kw: Any) -> int:
        kw.setdefault("step_time", 0.2)
        kw.setdefault("ckpt_every", 5)
        kw.setdefault("nccl_timeout", 3.0)
        job = manage.submit_training(lab_cfg, **kw)
        jobs.append(job)
        return job

    yield _submit
    if jobs:
        slurm(lab_cfg, "scancel", *map(str, jobs), check=False)
        eventually(
            lambda: not slurm(lab_cfg, "squeue", "-h", "-o", "%i", check=False).strip(),
            timeout=20,
            what="jobs cancelled",
        )


@pytest.fixture
def clean_faults(lab_cfg: LabConfig) -> Iterator[None]:
    yield
    manage.clear(lab_cfg)


def eventually(
    probe: Callable[[], T],
    *,
    timeout: float = 20.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Poll `probe` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as e:
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{what} not reached in {timeout:.0f}s; last: {last!r}")


def query(cfg: LabConfig, promql: str) -> list[dict[str, Any]]:
    return api.query(cfg, promql)


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Read an exporter's /metrics: metric name to its (labels, value) samples."""
    text = requests.get(url, timeout=5).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # The parser appends `_total` to every counter sample; dcgm-exporter's counters
            # (DCGM_FI_DEV_PCIE_REPLAY_COUNTER) do not have it. Keep the name as served.
            name = s.name if f"\n{s.name}{{" in text or f"\n{s.name} " in text else fam.name
            out.setdefault(name, []).append((s.labels, s.value))
    return out


def running_nodes(cfg: LabConfig, job: int) -> list[str]:
    def nodes() -> list[str]:
        try:
            return manage.running_job(cfg, job)[0]
        except Exception:
            return []

    return eventually(nodes, what=f"job {job} running")


def joblog(cfg: LabConfig, job: int, node: str, rank: int) -> Path:
    return cfg.joblogs / f"slurm-{job}-{node}-{rank}.out"
