"""A cached read of the lab cluster for the exporters, through slurmedic's own Slurm adapter
(so the exporters read every release's JSON as slurmedic does)."""

from __future__ import annotations

import threading
import time

from lab.config import LabConfig
from webhook.adapters.slurm import SlurmCluster, SlurmError, SlurmNode, SlurmSnapshot
from webhook.core.cluster import Job

CACHE_S = 0.5


class SlurmView:
    def __init__(self, cfg: LabConfig) -> None:
        self.cluster = SlurmCluster(env=cfg.env())
        self._lock = threading.Lock()
        self._at = 0.0
        self._snap: SlurmSnapshot | None = None
        self.ok = False

    def refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._at < CACHE_S:
                return
            try:
                self._snap = self.cluster.snapshot()
                self.ok = True
            except SlurmError:
                # slurmctld down: report what is known to fail, keep the last good view.
                self.ok = False
            self._at = time.monotonic()

    def nodes(self) -> list[SlurmNode]:
        self.refresh()
        return self._snap.nodes if self._snap else []

    def jobs(self) -> list[Job]:
        self.refresh()
        return self._snap.jobs if self._snap else []

    def job_on(self, node: str) -> int | None:
        """The running job holding `node` (lab jobs are exclusive), or None."""
        for job in self.jobs():
            if job.active and node in job.nodes:
                return job.id
        return None
