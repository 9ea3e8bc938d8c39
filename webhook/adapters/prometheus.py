"""Prometheus' HTTP API, through prometheus-api-client: training progress for verification
(instant queries) and series over a time span (range queries, for backtests).

prometheus-api-client 0.7 requires only requests and dateparser (pandas, numpy and matplotlib
are its `dataframe`/`numpy`/`plot` extras, not installed), and `PrometheusConnect` imports
neither dateparser nor numpy until a method that needs them is called. It gives the session
with its retry adapter, and the query and query_range calls; what it does not do, this module
does: it turns its errors (an HTTP status with the raw body) back into Prometheus' own `error`
text, and checks the answer's shape, since it returns `data.result` unchecked.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import datetime, timedelta
from typing import Any

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from webhook.core.recovery import RankProgress

FIELDS = {
    "training_attempt": "attempt",
    "training_step": "step",
    "training_last_step_timestamp_seconds": "step_at",
    "training_last_checkpoint_step": "checkpoint_step",
    "training_last_checkpoint_timestamp_seconds": "checkpoint_at",
    "training_attempt_start_timestamp_seconds": "started_at",
    "training_resume_step": "resume_step",
    "training_quality": "quality",
}
# How prometheus-api-client 0.7 words a non-200 answer: the status and the body's repr.
_HTTP_ERROR = re.compile(r"^HTTP Status Code (\d+) \((b'.*'|b\".*\")\)$", re.DOTALL)


class PrometheusError(RuntimeError):
    pass


class Prometheus:
    def __init__(self, url: str, timeout: float = 5.0, retries: int = 2) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        # Retried: a refused connection and Prometheus' "busy" answers (503 when its query
        # queue is full, 502/504 from a proxy), with 0 s then 1 s between tries. Not retried:
        # a read timeout (a slow Prometheus costs the loop one timeout a round, not three), nor
        # 4xx (a bad query stays bad). The last busy answer is kept, so its error is reported.
        retry = Retry(
            total=retries,
            connect=retries,
            read=0,
            status=retries,
            backoff_factor=0.5,
            status_forcelist=(502, 503, 504),
            raise_on_status=False,
        )
        # `timeout` goes to requests as is, which takes float seconds; the client says int.
        self.client = PrometheusConnect(url=self.url, retry=retry, timeout=timeout)  # type: ignore[arg-type]

    def query(self, expr: str, at: datetime | None = None) -> list[dict[str, Any]]:
        """An instant vector: `[{"metric": {...}, "value": [t, "v"]}, ...]` as of `at` (now)."""
        params = {} if at is None else {"time": at.timestamp()}
        result = self._call(lambda: self.client.custom_query(expr, params=params))
        return self._series(expr, result, "value", "a vector")

    def query_range(
        self, expr: str, start: datetime, end: datetime, step: timedelta
    ) -> list[dict[str, Any]]:
        """A range vector: `[{"metric": {...}, "values": [[t, "v"], ...]}, ...]` from `start`
        to `end` (whole seconds) every `step`."""
        result = self._call(
            lambda: self.client.custom_query_range(
                expr, start_time=start, end_time=end, step=f"{step.total_seconds():g}"
            ),
        )
        return self._series(expr, result, "values", "a matrix")

    def raw_samples(
        self, metric: str, labels: dict[str, str], start: datetime, end: datetime, chunk: timedelta
    ) -> list[tuple[dict[str, str], list[float]]]:
        """Every stored sample time of a metric's series from `start` to `end`, read in
        chunks (an instant query of a range selector per chunk: the samples as written, not a
        range query's resampling), merged per label set. Values are left out: a backtest asks
        when a series existed."""
        chunk = min(chunk, end - start) if end > start else chunk
        if end <= start or chunk.total_seconds() < 1:
            return []
        result = self._call(
            lambda: self.client.get_metric_range_data(
                metric, label_config=labels, start_time=start, end_time=end, chunk_size=chunk
            )
        )
        merged: dict[tuple[tuple[str, str], ...], list[float]] = {}
        for s in self._series(metric, result, "values", "a matrix"):
            key = tuple(sorted(s["metric"].items()))
            merged.setdefault(key, []).extend(float(t) for t, _ in s["values"])
        return [(dict(k), sorted(set(ts))) for k, ts in merged.items()]

    def checkpoint_times(self, job: int, window: timedelta) -> list[float]:
        """When the job's checkpoints were written, as its ranks reported them within
        `window`: the distinct values of the rank that reported the most."""
        expr = (
            f'training_last_checkpoint_timestamp_seconds{{slurm_job_id="{int(job)}"}}'
            f"[{int(window.total_seconds())}s]"
        )
        result = self._call(lambda: self.client.custom_query(expr))
        ranks = [
            sorted({float(v) for _, v in s["values"]})
            for s in self._series(expr, result, "values", "a matrix")
        ]
        return max(ranks, key=len, default=[])

    def rule_intervals(self) -> dict[str, timedelta]:
        """Each alerting rule's evaluation interval, by alert name (its group's)."""
        return {
            rule["name"]: timedelta(seconds=float(group["interval"]))
            for group, rule in self._alerting_rules()
        }

    def rule_delays(self) -> dict[str, float]:
        """Each alerting rule's `for:` in seconds, by alert name, as Prometheus evaluates it."""
        return {
            rule["name"]: float(rule.get("duration") or 0) for _, rule in self._alerting_rules()
        }

    def _alerting_rules(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        data = self._call(
            lambda: self.client._session.get(  # the client has no rules call
                f"{self.url}/api/v1/rules", params={"type": "alert"}, timeout=self.timeout
            ).json()
        )
        try:
            rules = [
                (group, rule)
                for group in data["data"]["groups"]
                for rule in group["rules"]
                if rule.get("type") == "alerting"
            ]
            for group, rule in rules:  # what the callers read, checked once
                _ = (float(group["interval"]), rule["name"], float(rule.get("duration") or 0))
            return rules
        except (KeyError, TypeError, ValueError) as e:
            raise PrometheusError(f"{self.url}: /api/v1/rules: not the API's answer ({e!r})") from e

    def flags(self) -> dict[str, str]:
        """Prometheus' command-line flags (`/api/v1/status/flags`): its retention among them."""
        data = self._call(
            lambda: self.client._session.get(
                f"{self.url}/api/v1/status/flags", timeout=self.timeout
            ).json()
        )
        flags = data.get("data") if isinstance(data, dict) else None
        if not isinstance(flags, dict):
            raise PrometheusError(f"{self.url}: /api/v1/status/flags: not the API's answer")
        return {str(k): str(v) for k, v in flags.items()}

    def _call(self, call: Any) -> Any:
        try:
            return call()
        except PrometheusApiClientException as e:
            raise PrometheusError(f"{self.url}: {_reason(str(e))}") from e
        except (requests.JSONDecodeError, KeyError, TypeError) as e:  # 200, but not the API's
            raise PrometheusError(f"{self.url}: not an answer of Prometheus' API ({e!r})") from e
        except requests.RequestException as e:
            raise PrometheusError(f"{self.url}: {e}") from e

    def _series(self, expr: str, result: Any, key: str, kind: str) -> list[dict[str, Any]]:
        # A scalar or string answer is `[t, "v"]`, not a list of series.
        if not isinstance(result, list) or not all(
            isinstance(s, dict) and isinstance(s.get("metric"), dict) and key in s for s in result
        ):
            raise PrometheusError(f"{self.url}: expected {kind} for {expr!r}")
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
            labels = s["metric"]
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


def _reason(message: str) -> str:
    """Prometheus' `error` from the client's "HTTP Status Code 400 (b'{...}')"; the status
    alone when the body is not the API's JSON (a proxy's page)."""
    match = _HTTP_ERROR.match(message)
    if match is None:
        return message
    try:
        body = json.loads(ast.literal_eval(match.group(2)))
    except (ValueError, SyntaxError):
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    return str(error) if error else f"HTTP {match.group(1)}"
