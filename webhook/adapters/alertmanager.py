"""Alertmanager's API v2, the one call slurmedic makes to it: post its own alerts (notices)."""

from __future__ import annotations

from typing import Any

import requests
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential


class AlertmanagerError(RuntimeError):
    """Alertmanager refused the alerts or could not be reached; the message says which."""


@retry(
    retry=retry_if_exception_type(requests.ConnectionError),
    stop=stop_after_attempt(3),
    wait=wait_exponential(multiplier=0.2, max=2),
    reraise=True,
)
def _post(url: str, alerts: list[dict[str, Any]], timeout: float) -> requests.Response:
    return requests.post(f"{url.rstrip('/')}/api/v2/alerts", json=alerts, timeout=timeout)


def post_alerts(url: str, alerts: list[dict[str, Any]], timeout: float = 10.0) -> None:
    if not alerts:
        return
    try:
        r = _post(url, alerts, timeout)
    except requests.RequestException as e:
        raise AlertmanagerError(f"{url}: {e}") from e
    if r.status_code != 200:
        raise AlertmanagerError(f"{url}: HTTP {r.status_code}: {r.text[:300]}")
