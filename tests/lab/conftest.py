"""The session's lab: a real Slurm cluster and monitoring stack on ports 27xxx, in a temp dir.

It is brought up once for all lab tests and torn down at the end, leaving nothing running.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from lab import api, manage, monitoring, processes
from lab.config import LabConfig
from lab.slurm import slurm
from webhook.ledger.store import Ledger
from webhook.service.config import load_config

T = TypeVar("T")
TEST_PORT_BASE = 27000


@pytest.fixture(scope="session")
def lab_cfg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabConfig]:
    cfg = LabConfig(run_dir=tmp_path_factory.mktemp("lab"), port_base=TEST_PORT_BASE)
    try:
        manage.up(cfg)
        yield cfg
    finally:
        manage.down(cfg)


@pytest.fixture
def submit(lab_cfg: LabConfig) -> Iterator[Callable[..., int]]:
    """Submit training jobs for one test; they are cancelled when it ends."""
    jobs: list[int] = []

    def _submit(**kw: Any) -> int:
        kw.setdefault("step_time", 0.2)
        kw.setdefault("ckpt_every", 5)
        kw.setdefault("nccl_timeout", 3.0)
        job = manage.submit_training(lab_cfg, **kw)
        jobs.append(job)
        return job

    yield _submit
    if jobs:
        slurm(lab_cfg, "scancel", *map(str, jobs), check=False)
        eventually(
            lambda: not slurm(lab_cfg, "squeue", "-h", "-o", "%i", check=False).strip(),
            timeout=20,
            what="jobs cancelled",
        )


@pytest.fixture
def clean_faults(lab_cfg: LabConfig) -> Iterator[None]:
    yield
    manage.clear(lab_cfg)


def eventually(
    probe: Callable[[], T],
    *,
    timeout: float = 20.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Poll `probe` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as e:
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{what} not reached in {timeout:.0f}s; last: {last!r}")


def query(cfg: LabConfig, promql: str) -> list[dict[str, Any]]:
    return api.query(cfg, promql)


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Read an exporter's /metrics: metric name to its (labels, value) samples."""
    text = requests.get(url, timeout=5).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # The parser appends `_total` to every counter sample; dcgm-exporter's counters
            # (DCGM_FI_DEV_PCIE_REPLAY_COUNTER) do not have it. Keep the name as served.
            name = s.name if f"\n{s.name}{{" in text or f"\n{s.name} " in text else fam.name
            out.setdefault(name, []).append((s.labels, s.value))
    return out


def running_nodes(cfg: LabConfig, job: int) -> list[str]:
    def nodes() -> list[str]:
        try:
            return manage.running_job(cfg, job)[0]
        except Exception:
            return []

    return eventually(nodes, what=f"job {job} running")


def joblog(cfg: LabConfig, job: int, node: str, rank: int) -> Path:
    return cfg.joblogs / f"slurm-{job}-{node}-{rank}.out"


class Receiver:
    """An HTTP endpoint standing in for slurmedic's webhook: records what Alertmanager sends."""

    def __init__(self, port: int) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.notifications.append(
                        {
                            "path": self.path,
                            "authorization": self.headers.get("Authorization"),
                            "at": time.time(),
                            "payload": body,
                        }
                    )
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(
        self, alertname: str, *, since: float = 0.0, path: str = "/api/v1/alerts", **labels: str
    ) -> list[dict[str, Any]]:
        """Firing alerts named `alertname` with `labels`, delivered to `path` after `since`."""
        with self.lock:
            found = []
            for n in self.notifications:
                if n["path"] != path or n["at"] < since:
                    continue
                for a in n["payload"]["alerts"]:
                    lb = a["labels"]
                    if (
                        a["status"] == "firing"
                        and lb.get("alertname") == alertname
                        and all(lb.get(k) == v for k, v in labels.items())
                    ):
                        found.append(a)
            return found


@pytest.fixture(scope="module")
def receiver(lab_cfg: LabConfig) -> Iterator[Receiver]:
    r = Receiver(lab_cfg.receiver_port)
    yield r
    r.server.shutdown()
    r.server.server_close()


def serve_slurmedic(cfg: LabConfig, tmp: Path, mode: str, **overrides: Any) -> Ledger:
    """slurmedic with the lab tests' policy in `mode` (`overrides` replace its keys)."""
    policy = tmp / f"policy-{mode}.yml"
    policy.write_text(
        yaml.safe_dump(
            {
                "mode": mode,
                "settle_seconds": 5,
                "hang_wait": monitoring.LAB_HANG_WAIT,
                "breaker": {"max_fraction": 0.5},
                "verify": {"deadline": "90s"},
                # One fault per test, but several tests within minutes under the lab's 4-node
                # leaves would look like a switch storm: these tests are not about that.
                "shared_cause": {"switch_min_nodes": 5, "cluster_min_nodes": 9},
            }
            | overrides
        )
    )
    processes.stop(cfg, "slurmedic")
    # Earlier tests' drains (monitor ones too) count against the breaker; a human resets it.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "breaker",
            "reset",
            f"--config={cfg.slurmedic_config}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    monitoring.start_slurmedic(cfg, policy)
    return Ledger(load_config(cfg.slurmedic_config).database_url)
