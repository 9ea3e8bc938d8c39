"""The Prometheus adapter against the lab's real Prometheus: instant and range queries, a
running job's training progress, and Prometheus' own words when a query is wrong or Prometheus
is not there."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from lab import monitoring
from lab.config import LabConfig
from tests.lab.conftest import eventually, running_nodes
from webhook.adapters.prometheus import Prometheus, PrometheusError
from webhook.rules.delays import rule_delays
from webhook.rules.render import RuleSource

pytestmark = pytest.mark.lab


def test_an_instant_query_answers_a_vector(lab_cfg: LabConfig) -> None:
    series = Prometheus(lab_cfg.prometheus_url).query('up{job="prometheus"}')
    assert len(series) == 1
    assert series[0]["metric"]["job"] == "prometheus"
    assert series[0]["value"][1] == "1"


def test_the_rules_prometheus_evaluates_give_each_alert_s_for_and_interval(
    lab_cfg: LabConfig,
) -> None:
    prom = Prometheus(lab_cfg.prometheus_url)
    # The lab's rules profile, as the rendered files hold it (webhook/rules/delays.py reads
    # the same from the files): the trial report's delays on a live site.
    assert prom.rule_delays() == rule_delays(RuleSource(), monitoring.rules_profile(lab_cfg))
    assert prom.rule_delays()["GpuNvlinkErrors"] == 5
    assert set(prom.rule_intervals()) == set(prom.rule_delays())


def test_a_range_query_answers_a_matrix_over_the_span(lab_cfg: LabConfig) -> None:
    prom = Prometheus(lab_cfg.prometheus_url)
    # A span Prometheus has scraped itself through (its first scrape is at its start).
    end = datetime.now(UTC)
    start = end - timedelta(seconds=20)
    series = eventually(
        lambda: prom.query_range('up{job="prometheus"}', start, end, timedelta(seconds=5)),
        what="a range of up",
    )
    (s,) = series
    times = [t for t, _ in s["values"]]
    assert all(v == "1" for _, v in s["values"])
    assert times == sorted(times) and all(b - a == 5 for a, b in itertools.pairwise(times))
    assert start.timestamp() - 1 <= times[0] and times[-1] <= end.timestamp() + 1


def test_progress_of_a_running_job(lab_cfg: LabConfig, submit: Callable[..., int]) -> None:
    job = submit(nodes=2)
    running_nodes(lab_cfg, job)
    prom = Prometheus(lab_cfg.prometheus_url)
    ranks = eventually(
        lambda: (
            (r := prom.progress_of({job}).get(job, []))
            and len(r) == 2
            and all(p.step is not None for p in r)
            and r
        ),
        what="two ranks' steps",
    )
    assert [r.rank for r in ranks] == [0, 1]
    assert all(r.attempt == 0 and r.started_at is not None for r in ranks)
    assert prom.progress_of({job + 1000}) == {}


def test_a_bad_query_is_prometheus_own_error(lab_cfg: LabConfig) -> None:
    prom = Prometheus(lab_cfg.prometheus_url)
    with pytest.raises(PrometheusError, match=r": 1:\d+: parse error"):
        prom.query("up{")
    with pytest.raises(PrometheusError, match="expected a vector for 'scalar"):
        prom.query("scalar(vector(1))")
    end = datetime.now(UTC)
    with pytest.raises(PrometheusError, match="exceeded maximum resolution of 11,000 points"):
        prom.query_range("up", end - timedelta(days=1), end, timedelta(seconds=1))


def test_no_prometheus_is_an_error_naming_the_url() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(PrometheusError, match=rf"^{url}: .*(refused|Max retries)"):
            Prometheus(url).query("up")
