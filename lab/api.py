"""Thin readers of the lab's Prometheus and Alertmanager HTTP APIs."""

from __future__ import annotations

from typing import Any

import requests

from lab.config import LabConfig
from lab.slurm import LabError


def query(cfg: LabConfig, promql: str) -> list[dict[str, Any]]:
    """An instant query; each result as {"labels": {...}, "value": float}."""
    r = requests.get(f"{cfg.prometheus_url}/api/v1/query", params={"query": promql}, timeout=5)
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
