"""Training progress from Prometheus (what ranks pushed to the Pushgateway), for verification.

One instant query per job and round, over Prometheus's HTTP API with `requests` (already a
dependency): prometheus-api-client would pull in pandas, numpy and matplotlib for two calls.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import requests

from webhook.core.recovery import RankProgress

FIELDS = {
    "training_attempt": "attempt",
    "training_step": "step",
    "training_last_step_timestamp_seconds": "step_at",
    "training_last_checkpoint_step": "checkpoint_step",
    "training_last_checkpoint_timestamp_seconds": "checkpoint_at",
    "training_attempt_start_timestamp_seconds": "started_at",
}


class PrometheusError(RuntimeError):
    pass


class Prometheus:
    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        self.http = requests.Session()

    def query(self, expr: str, at: datetime | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at.timestamp()
        try:
            r = self.http.get(f"{self.url}/api/v1/query", params=params, timeout=self.timeout)
            body = r.json()
        except (requests.RequestException, ValueError) as e:
            raise PrometheusError(f"{self.url}: {e}") from e
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            raise PrometheusError(f"{self.url}: {error or f'HTTP {r.status_code}'}")
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise PrometheusError(f"{self.url}: expected a vector for {expr!r}")
        result: list[dict[str, Any]] = data.get("result") or []
        return result

    def progress_of(
        self, jobs: set[int], at: datetime | None = None
    ) -> dict[int, list[RankProgress]]:
        """Every rank's last pushed progress of each job (as of `at`, default now)."""
        if not jobs:
            return {}
        names = "|".join(FIELDS)
        ids = "|".join(str(int(j)) for j in sorted(jobs))
        series = self.query(f'{{__name__=~"{names}",slurm_job_id=~"{ids}"}}', at)
        ranks: dict[tuple[int, int], dict[str, float]] = {}
        for s in series:
            labels = s.get("metric") or {}
            try:
                key = (int(labels["slurm_job_id"]), int(labels["rank"]))
                value = float(s["value"][1])
                field = FIELDS[labels["__name__"]]
            except (KeyError, TypeError, ValueError, IndexError):
                continue  # not a series of ours: skip it, not the round
            ranks.setdefault(key, {})[field] = value
        out: dict[int, list[RankProgress]] = {}
        for (job, rank), f in sorted(ranks.items()):
            attempt = f.pop("attempt", None)
            out.setdefault(job, []).append(
                RankProgress(rank, None if attempt is None else int(attempt), **f)
            )
        return out
