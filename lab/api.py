"""Thin readers of the lab's Prometheus and Alertmanager HTTP APIs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from lab.config import LabConfig
from lab.slurm import LabError


def query(cfg: LabConfig, promql: str, prometheus: str | None = None) -> list[dict[str, Any]]:
    """An instant query of the lab's Prometheus (or the one at URL `prometheus`, a shard's);
    each result as {"labels": {...}, "value": float}."""
    url = prometheus or cfg.prometheus_url
    r = requests.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5)
    body = r.json()
    if body.get("status") != "success":
        raise LabError(f"query: {body.get('error', r.text)}")
    return [{"labels": s["metric"], "value": float(s["value"][1])} for s in body["data"]["result"]]


def alerts(cfg: LabConfig, **labels: str) -> list[dict[str, Any]]:
    """Active alerts in Alertmanager whose labels include `labels`."""
    flt = [f'{k}="{v}"' for k, v in labels.items()]
    r = requests.get(f"{cfg.alertmanager_url}/api/v2/alerts", params={"filter": flt}, timeout=5)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()
    return result


def silences(
    cfg: LabConfig, created_by: str, alertmanager: str | None = None
) -> list[dict[str, Any]]:
    """Alertmanager's active silences created by `created_by` (the lab's Alertmanager's, or
    those of the one at `alertmanager`)."""
    url = alertmanager or cfg.alertmanager_url
    r = requests.get(f"{url}/api/v2/silences", timeout=5)
    r.raise_for_status()
    return [
        s for s in r.json() if s["createdBy"] == created_by and s["status"]["state"] == "active"
    ]


def silence(
    cfg: LabConfig, labels: dict[str, str], *, lasting: timedelta, created_by: str, comment: str
) -> str:
    """Silence the alerts whose labels include `labels` (each an exact match); its ID."""
    now = datetime.now(UTC)
    body = {
        "matchers": [{"name": k, "value": v, "isRegex": False} for k, v in sorted(labels.items())],
        "startsAt": now.isoformat(),
        "endsAt": (now + lasting).isoformat(),
        "createdBy": created_by,
        "comment": comment,
    }
    r = requests.post(f"{cfg.alertmanager_url}/api/v2/silences", json=body, timeout=5)
    if r.status_code != 200:
        raise LabError(f"silence {labels}: Alertmanager said {r.status_code} {r.text.strip()}")
    return str(r.json()["silenceID"])


def expire_silence(cfg: LabConfig, silence_id: str) -> None:
    r = requests.delete(f"{cfg.alertmanager_url}/api/v2/silence/{silence_id}", timeout=5)
    r.raise_for_status()
