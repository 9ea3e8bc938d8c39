"""A cached read of the lab cluster's `sinfo --json` and `squeue --json` for the exporters."""

from __future__ import annotations

import threading
import time
from typing import Any

import hostlist

from lab.config import LabConfig
from lab.slurm import LabError, slurm_json

CACHE_S = 0.5


class SlurmView:
    def __init__(self, cfg: LabConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._at = 0.0
        self._nodes: list[dict[str, Any]] = []
        self._jobs: list[dict[str, Any]] = []
        self.ok = False

    def refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._at < CACHE_S:
                return
            try:
                self._nodes = slurm_json(self.cfg, "sinfo")["nodes"]
                self._jobs = slurm_json(self.cfg, "squeue")["jobs"]
                self.ok = True
            except (LabError, OSError, ValueError, KeyError):
                # slurmctld down: report what is known to fail, keep the last good view.
                self.ok = False
            self._at = time.monotonic()

    def nodes(self) -> list[dict[str, Any]]:
        self.refresh()
        return self._nodes

    def jobs(self) -> list[dict[str, Any]]:
        self.refresh()
        return self._jobs

    def job_on(self, node: str) -> int | None:
        """The running job holding `node` (lab jobs are exclusive), or None."""
        for job in self.jobs():
            if job.get("job_state") in ("RUNNING", "COMPLETING") and node in job_nodes(job):
                return int(job["job_id"])
        return None


def job_nodes(job: dict[str, Any]) -> list[str]:
    nodes = job.get("nodes") or ""
    return list(hostlist.expand_hostlist(nodes)) if nodes else []
