"""A cached read of the lab cluster for the exporters, through slurmedic's own Slurm adapter
(so the exporters read every release's JSON as slurmedic does)."""

from __future__ import annotations

import threading
import time

from lab.config import LabConfig
from webhook.adapters.slurm import SlurmCluster, SlurmError, SlurmNode
from webhook.core.cluster import Job

# As old as a scrape interval at most. Each read is a Slurm command in the stack's root (a
# mount namespace of its own): the lab's exporters read no more often than Prometheus scrapes.
CACHE_S = 1.0


class SlurmView:
    """The jobs, and the nodes when `with_nodes` (dcgm-exporter's job mapping needs only the
    jobs), read at most once per CACHE_S."""

    def __init__(self, cfg: LabConfig, with_nodes: bool = True) -> None:
        self.cluster = SlurmCluster(env=cfg.env())
        self._with_nodes = with_nodes
        self._lock = threading.Lock()
        self._at = 0.0
        self._nodes: list[SlurmNode] = []
        self._jobs: list[Job] = []
        self.ok = False

    def refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._at < CACHE_S:
                return
            try:
                nodes = self.cluster.nodes() if self._with_nodes else []
                self._nodes, self._jobs = nodes, self.cluster.jobs()
                self.ok = True
            except SlurmError:
                # slurmctld down: report what is known to fail, keep the last good view.
                self.ok = False
            self._at = time.monotonic()

    def nodes(self) -> list[SlurmNode]:
        self.refresh()
        return self._nodes

    def jobs(self) -> list[Job]:
        self.refresh()
        return self._jobs

    def job_on(self, node: str) -> int | None:
        """The running job holding `node` (lab jobs are exclusive), or None."""
        for job in self.jobs():
            if job.active and node in job.nodes:
                return job.id
        return None
