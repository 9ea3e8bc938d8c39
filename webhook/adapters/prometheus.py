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
        if body.get("status") != "success":
            raise PrometheusError(f"{self.url}: {body.get('error', r.status_code)}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def progress(self, job: int, at: datetime | None = None) -> list[RankProgress]:
        """Every rank's last pushed progress of `job` (as of `at`, default now)."""
        names = "|".join(FIELDS)
        series = self.query(f'{{__name__=~"{names}",slurm_job_id="{int(job)}"}}', at)
        ranks: dict[int, dict[str, float]] = {}
        for s in series:
            labels = s["metric"]
            try:
                rank = int(labels.get("rank", ""))
                value = float(s["value"][1])
            except (TypeError, ValueError):
                continue
            ranks.setdefault(rank, {})[FIELDS[labels["__name__"]]] = value
        out = []
        for rank, f in sorted(ranks.items()):
            attempt = f.pop("attempt", None)
            out.append(RankProgress(rank, None if attempt is None else int(attempt), **f))
        return out
