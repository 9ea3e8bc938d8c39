"""What the lab benchmarks share: a lab of their own with slurmedic enforcing, and polling."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lab import manage, monitoring
from lab.config import LabConfig
from lab.slurm import LabError, slurm
from webhook.core.cluster import ENDED_STATES
from webhook.core.lifecycle import WAITING
from webhook.ledger.store import Ledger
from webhook.service.config import load_config

T = TypeVar("T")


def wait(probe: Callable[[], T | None], timeout: float = 90.0, interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(probe)


@contextmanager
def enforcing_lab(
    port_base: int, settle: float, **policy: Any
) -> Iterator[tuple[LabConfig, Ledger]]:
    """A fresh lab in a temporary directory, slurmedic serving it in enforce mode (breaker wide
    open, shared-cause thresholds out of reach: one fault per round); everything stopped and
    deleted afterwards."""
    cfg = LabConfig(run_dir=Path(tempfile.mkdtemp(prefix="slurmedic-bench-")), port_base=port_base)
    try:
        manage.up(cfg)
        path = cfg.run_dir / "enforce.yml"
        path.write_text(
            yaml.safe_dump(
                {
                    "mode": "enforce",
                    "settle_seconds": settle,
                    "breaker": {"max_fraction": 1.0},
                    "shared_cause": {"switch_min_nodes": 5, "cluster_min_nodes": 9},
                    **policy,
                }
            )
        )
        monitoring.start_slurmedic(cfg, path)
        yield cfg, Ledger(load_config(cfg.slurmedic_config).database_url)
    finally:
        manage.down(cfg, purge=True)  # slurmedic first, as a lab process


def running_nodes(cfg: LabConfig, job: int) -> list[str]:
    def nodes() -> list[str] | None:
        try:
            return manage.running_job(cfg, job)[0]  # one scontrol a round
        except LabError:
            return None  # not running yet

    try:
        return wait(nodes, interval=0.2)
    except TimeoutError:
        info = manage.show_job(cfg, job)
        sinfo = slurm(cfg, "sinfo", "-N", "-h", "-o", "%N %t %E")
        raise TimeoutError(
            f"job {job} not running: {info.get('JobState')} {info.get('Reason')}\n{sinfo}"
        ) from None


def finish_round(cfg: LabConfig, ledger: Ledger, job: int, node: str) -> None:
    """Leave the lab as the round found it: the job's decisions carried out (a requeue must
    not release the job after it was cancelled), the job gone, faults cleared, the node back."""
    incident = f"{job}.0"
    wait(
        lambda: not any(r.state in WAITING for r in ledger.incident_decisions(incident)),
        timeout=60,
    )
    slurm(cfg, "scancel", str(job), check=False)
    wait(lambda: manage.show_job(cfg, job).get("JobState") in ENDED_STATES)
    manage.clear(cfg)
    slurm(cfg, "scontrol", "update", f"nodename={node}", "state=resume", check=False)
    time.sleep(3)


def executed_at(ledger: Ledger, incident: str, action: str) -> tuple[float, float] | None:
    """(decided, executed) epoch seconds of an incident's decision once it is executed."""
    for row in ledger.incident_decisions(incident):
        if row.action == action and row.state == "executed":
            found = ledger.decision(row.id)
            events = found[1] if found else []
            done = next(e.at.timestamp() for e in events if e.state == "executed")
            return row.at.timestamp(), done
    return None


def report(rows: list[dict[str, float]], labels: dict[str, str] | None = None) -> None:
    """Median, min and max of every figure over the rounds."""
    labels = labels or {}
    for key in rows[0] if rows else []:
        values = [r[key] for r in rows]
        print(
            f"  {labels.get(key, key):52} median {statistics.median(values):7.2f}  "
            f"(min {min(values):.2f}, max {max(values):.2f})"
        )
