"""The session's lab: a real Slurm cluster and monitoring stack on ports 27xxx, in a temp dir.

It is brought up once for all lab tests and torn down at the end, leaving nothing running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from lab import api, manage, monitoring, postgres, processes
from lab.config import LabConfig
from lab.slurm import slurm
from webhook.adapters.accounting import Accounting
from webhook.backtest.history import NodeEvent
from webhook.ledger.store import Ledger
from webhook.service.config import load_config

T = TypeVar("T")
# SLURMEDIC_TEST_PORT_BASE lets two test runs share one machine.
TEST_PORT_BASE = int(os.environ.get("SLURMEDIC_TEST_PORT_BASE", "27000"))
# How long a lab test waits for a playbook run, or for what follows one (a requeued job running
# again): seconds each on a quiet machine, more on a loaded one (the executor's deadlines only
# bound a hang). A bound on a wait for the event, not a guess at when it comes.
PLAYBOOK_RUN_S = 120.0


@pytest.fixture(scope="session")
def lab_cfg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabConfig]:
    # The runs unweighted (LabConfig.weigh_runs says why): the lab tests bound a playbook run by
    # PLAYBOOK_RUN_S, not by what another stack's lab leaves of the CPU.
    cfg = LabConfig(
        run_dir=tmp_path_factory.mktemp("lab"), port_base=TEST_PORT_BASE, weigh_runs=False
    )
    try:
        manage.up(cfg)
        yield cfg
    finally:
        manage.down(cfg)
        # The replica tests' PostgreSQL keeps its cluster outside the run dir.
        shutil.rmtree(postgres.data_dir(cfg), ignore_errors=True)


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
        try:
            eventually(lambda: not queue(lab_cfg), timeout=30, what="jobs cancelled")
        except AssertionError as e:
            # Say what is left, and leave nothing: one test's leftover job would hold nodes
            # (and fail this same wait) in every test after it.
            left = queue(lab_cfg)
            slurm(lab_cfg, "scancel", "--full", *(line.split()[0] for line in left), check=False)
            eventually(lambda: not queue(lab_cfg), timeout=60, what="leftover jobs cancelled")
            stories = "\n".join(job_story(lab_cfg, int(line.split()[0])) for line in left)
            raise AssertionError(
                f"{e}; jobs left (id state reason nodes name): {left}\n{stories}"
            ) from None


def queue(cfg: LabConfig) -> list[str]:
    """Every job Slurm still knows, a line each: id, state, reason, nodes, name."""
    out = slurm(cfg, "squeue", "-h", "-o", "%i %T %r %N %j", check=False)
    return [line for line in out.splitlines() if line.strip()]


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
            got = probe()
        except Exception as e:
            last = e
        else:
            last = got
            if got:
                return got
        time.sleep(interval)
    raise AssertionError(f"{what} not reached in {timeout:.0f}s; last: {last!r}")


def quiet(cfg: LabConfig, job: int, nodes: list[str], *, timeout: float = 120.0) -> None:
    """Wait until no alert for slurmedic that could be evidence about `job` names any of its
    `nodes`, in Prometheus (firing or pending) or in Alertmanager: an earlier test's fault,
    cleared but not yet resolved, would otherwise be evidence in the incident this test is
    about (its GPU series take the new job's id, so a silence of the old alert does not cover
    them). An alert that names another job is that job's, whatever its node (slurmedic files
    it there): a job log's alerts outlive their job by their window."""
    pattern = "|".join(re.escape(n) for n in nodes)

    def ours(labels: dict[str, str]) -> bool:
        return labels.get("node") in nodes and labels.get("slurm_job_id") in (None, str(job))

    def about_nodes() -> list[dict[str, str]]:
        found = [r["labels"] for r in api.query(cfg, f'ALERTS{{signal!="",node=~"{pattern}"}}')]
        found += [a["labels"] for a in api.alerts(cfg) if a["labels"].get("signal")]
        return [labels for labels in found if ours(labels)]

    left: list[dict[str, str]] = []

    def none_left() -> bool:
        left[:] = about_nodes()
        return not left

    try:
        eventually(none_left, timeout=timeout, what=f"no alert about {pattern}")
    except AssertionError:
        raise AssertionError(f"alerts about {pattern} still active: {left}") from None


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
    """The nodes of `job` once its attempt runs on every one of them.

    RUNNING in Slurm means the batch script started; srun may still be launching the ranks. A
    test that kills a node then would fail the launch (the job ends in an error, not
    NODE_FAIL), so this waits for every rank's first line of this attempt in its log."""

    def nodes() -> list[str]:
        try:
            names, attempt = manage.running_job(cfg, job)
        except Exception:
            return []
        for rank, node in enumerate(names):
            log = joblog(cfg, job, node, rank)
            if f" job {job} attempt {attempt} on {node}:" not in (
                log.read_text() if log.exists() else ""
            ):
                return []
        return names

    return eventually(nodes, timeout=30, what=f"job {job} running on every node")


def job_story(cfg: LabConfig, job: int) -> str:
    """What Slurm says of `job`: its state now and slurmctld's log lines about it. A failed
    wait's message, so a lab failure in CI says what Slurm did without its logs."""
    try:
        info = manage.show_job(cfg, job)
        now = " ".join(
            f"{k}={info.get(k)}"
            for k in ("JobState", "Reason", "Restarts", "NodeList", "ExcNodeList", "BatchHost")
        )
    except Exception as e:
        now = f"(not known: {e})"
    log = cfg.logs / "slurmctld.log"
    about = re.compile(rf"JobId={job}(\D|$)")
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if about.search(ln)]
    return "\n".join([f"job {job}: {now}", *lines[-40:]])


def node_events(cfg: LabConfig, node: str) -> list[NodeEvent]:
    """`node`'s DOWN and DRAIN events of the last day, as slurmedic's accounting adapter reads
    them (the backtest's own reader, with an explicit window: no default of sacctmgr's)."""
    now = datetime.now(UTC)
    window = (now - timedelta(days=1), now + timedelta(hours=1))
    return [e for e in Accounting(cfg.slurm_env()).node_events(*window) if e.node == node]


def node_story(cfg: LabConfig, node: str) -> str:
    """What Slurm says of `node`: its state, its accounting events and slurmctld's and
    slurmdbd's log lines about it. A failed wait's message, as `job_story` is for a job."""
    reads: list[tuple[str, Callable[[], str]]] = [
        ("sinfo", lambda: slurm(cfg, "sinfo", "-h", "-N", "-n", node, "-o", "%N %T %E")),
        ("sacctmgr", lambda: "\n".join(map(str, node_events(cfg, node)))),
    ]
    parts = []
    for name, read in reads:
        try:
            parts.append(read())
        except Exception as e:
            parts.append(f"{name}: (not known: {e})")
    about = re.compile(rf"\b{re.escape(node)}\b")
    for log_name in ("slurmctld.log", "slurmdbd.log"):
        log = cfg.logs / log_name
        if log.exists():
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if about.search(ln)]
            parts += [f"-- {log_name}", *lines[-20:]]
    return "\n".join([f"node {node}:", *parts])


def slurmedic_story(cfg: LabConfig, ledger: Ledger, job: int) -> str:
    """What slurmedic made of `job`: every decision in its ledger, the alert events it stored
    about the job, the job's alerts in Prometheus and Alertmanager (with what silences or
    inhibits them), and the end of its log. A failed wait's message, so a lab failure in CI
    says where the chain from fault to action stopped without the run's files."""
    lines: list[str] = []

    def part(title: str, read: Callable[[], list[str]]) -> None:
        try:
            got = read()
        except Exception as e:
            got = [f"(not read: {e!r})"]
        lines.extend([f"-- {title}:", *(f"  {g}" for g in got)])

    def decisions() -> list[str]:
        return [
            f"#{r.id} {r.at:%H:%M:%S} {r.incident} {r.action} {r.state} ({r.reason})"
            for r in ledger.decisions(50)
        ]

    def stored() -> list[str]:
        ours = [
            (at, a)
            for _, at, a in ledger.alerts_after(0)
            if a.labels.get("slurm_job_id") in (str(job), None, "")
        ]
        # startsAt says whether an alert without the job label began before the job ran
        # there (an earlier test's, delivered late) or during it (the exporter's job mapping).
        return [
            f"{at:%H:%M:%S} {a.status} {a.labels.get('alertname')} startsAt "
            f"{a.startsAt:%H:%M:%S} {dict(a.labels)}"
            for at, a in ours[-15:]
        ]

    def in_slurm() -> list[str]:
        info = manage.show_job(cfg, job)
        keys = ("JobState", "Restarts", "SubmitTime", "StartTime", "EndTime", "NodeList")
        return [" ".join(f"{k}={info.get(k)}" for k in keys)]

    def silenced() -> list[str]:
        return [
            f"since {s['startsAt']} { ({m['name']: m['value'] for m in s['matchers']}) }"
            for s in api.silences(cfg, SILENCER)
        ]

    def in_prometheus() -> list[str]:
        return [
            f"{r['labels'].get('alertstate')} {r['labels']}"
            for r in api.query(cfg, f'ALERTS{{signal!="",slurm_job_id="{job}"}}')
        ]

    def in_alertmanager() -> list[str]:
        return [
            f"{a['status']} {a['labels'].get('alertname')} {a['labels']}"
            for a in api.alerts(cfg, slurm_job_id=str(job))
        ]

    def log_tail() -> list[str]:
        # Its terms (a lease that lapsed drops the loop) and restarts, then its last lines.
        text = (cfg.logs / "slurmedic.out").read_text(errors="replace").splitlines()
        terms = [ln for ln in text[:-25] if "leadership" in ln or "the loop " in ln]
        return [*terms[-10:], *text[-25:]]

    part("decisions", decisions)
    part(f"alert events stored (job {job} or none)", stored)
    part("the job in Slurm", in_slurm)
    part("ALERTS in Prometheus", in_prometheus)
    part("in Alertmanager", in_alertmanager)
    part("silences of earlier tests' alerts", silenced)
    part("slurmedic.out", log_tail)
    return "\n".join(lines)


def next_attempt(cfg: LabConfig, job: int, restarts: int = 1, timeout: float = 60) -> list[str]:
    """The nodes of `job`'s attempt `restarts` once it runs on all of them (`running_nodes`)."""

    def running() -> list[str]:
        info = manage.show_job(cfg, job)
        if info["JobState"] != "RUNNING" or info["Restarts"] != str(restarts):
            return []
        return running_nodes(cfg, job)

    try:
        return eventually(running, timeout=timeout, what=f"attempt {restarts} running")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{job_story(cfg, job)}") from None


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


def lab_policy(tmp: Path, mode: str, **overrides: Any) -> Path:
    """The lab tests' policy in `mode` (`overrides` replace its keys), written in `tmp`."""
    policy = tmp / f"policy-{mode}.yml"
    policy.write_text(
        yaml.safe_dump(
            {
                "mode": mode,
                "settle_seconds": 5,
                "hang_wait": monitoring.LAB_HANG_WAIT,
                "breaker": {"max_fraction": 0.5},
                "verify": {"deadline": "90s"},
                # A node a test drains is healed by the test (heal), not rebooted behind its
                # back: the repair loop's own tests enable it (tests/lab/test_repairs.py).
                "repairs": {"enabled": False},
                # One fault per test, but several tests within minutes under the lab's 4-node
                # leaves would look like a switch storm, and three faults within five minutes
                # on 8 nodes like a burst: these tests are not about that (a test about them
                # gives shared_cause of its own). Slurm notices a dead slurmd within seconds
                # here and the lab scrapes every second: a burst's hold, scaled.
                "shared_cause": {
                    "switch_min_nodes": 5,
                    "cluster_min_nodes": 9,
                    "burst_min_nodes": 9,
                    "burst_wait": monitoring.LAB_BURST_WAIT,
                },
            }
            | overrides
        )
    )
    return policy


def serve_slurmedic(
    cfg: LabConfig, tmp: Path, mode: str, *, restart: bool = False, **overrides: Any
) -> Ledger:
    """slurmedic with the lab tests' policy in `mode` (`overrides` replace its keys), on a new
    ledger; with `restart`, the running one restarted on its ledger, with this policy."""
    policy = lab_policy(tmp, mode, **overrides)
    processes.stop(cfg, "slurmedic")
    if not restart:
        start_afresh(cfg)
    monitoring.start_slurmedic(cfg, policy)
    return Ledger(load_config(cfg.slurmedic_config).database_url)


def start_afresh(cfg: LabConfig) -> None:
    """What the next slurmedic must not inherit from earlier tests: their ledger (with it their
    drains on the breaker, and its state), their alerts still in Alertmanager."""
    # A ledger of its own: alerts an earlier test's slurmedic stored but had not decided (a
    # fault that test left, seen just before it healed the cluster) would be decided by this
    # one after its restart, as they must be in production. Earlier ledgers stay beside it.
    # The new ledger holds no drain and a closed breaker: nothing to reset (a command on a
    # ledger that does not exist yet is refused, as it must be).
    db = Path(load_config(cfg.slurmedic_config).database_url.removeprefix("sqlite:///"))
    if db.exists():
        kept = len(list(db.parent.glob("ledger.*.db")))
        for part in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            if part.exists():
                part.rename(db.with_name(f"ledger.{kept}.db{part.name.removeprefix(db.name)}"))
    silence_leftovers(cfg)
    # A silence mutes a group's next flush, not a notification already made: one that an
    # earlier test's slurmedic did not take (stopped, or its disk full) is retried until the
    # group's timeout (10 s at least; a peer Alertmanager waits its turn first) and would reach
    # this one (CI saw an earlier test's XID drain the node this test's job then lost). A
    # reload stops every aggregation group, and with it each retry; the new groups flush what
    # is not silenced: on a peer, once the silences have reached it by gossip.
    ids = {s["id"] for s in api.silences(cfg, SILENCER)}

    def gossiped(url: str) -> bool:
        return ids <= {s["id"] for s in api.silences(cfg, SILENCER, url)}

    for url in monitoring.alertmanager_urls(cfg)[1:]:
        eventually(partial(gossiped, url), what=f"the silences at the peer Alertmanager {url}")
    monitoring.reload_alertmanagers(cfg)


SILENCER = "slurmedic-lab-tests"
SESSION = timedelta(days=1)  # longer than any test session; expired when its alert has gone


def silence_leftovers(cfg: LabConfig) -> None:
    """Silence, in Alertmanager, every alert for slurmedic that is active or pending now.

    They are earlier tests' (this test has injected nothing yet): faults already cleared whose
    windows have not passed, jobs already ended. A slurmedic started on a ledger of its own
    would take them as new and act, as it must in production: requeue another test's crashed
    job, drain a node healed since. Each silence matches one alert's labels exactly, so a new
    fault (another job, node or GPU) is not covered. A silence lasts until its alert has gone
    (expired here, at a later start), not for a guessed time: the session's lab goes with it."""
    firing = [a["labels"] for a in api.alerts(cfg) if a["labels"].get("signal")]
    pending = [
        {k: v for k, v in r["labels"].items() if k not in ("__name__", "alertstate")}
        for r in api.query(cfg, 'ALERTS{signal!=""}')
    ]
    # An alert of a GPU no job holds has no job label, and a silence of its labels would match
    # the same GPU's next fault in a job too (extra labels do not stop a matcher): the job
    # label is matched empty, as it is.
    leftovers = {
        tuple(sorted(({"slurm_job_id": ""} | labels).items())) for labels in firing + pending
    }

    def covers(matchers: set[tuple[str, str]]) -> bool:
        return any(matchers <= set(labels) for labels in leftovers)

    kept = []
    for s in api.silences(cfg, SILENCER):
        matchers = {(m["name"], m["value"]) for m in s["matchers"]}
        if covers(matchers):
            kept.append(matchers)
        else:
            api.expire_silence(cfg, s["id"])
    for labels in sorted(leftovers, key=len):
        if not any(m <= set(labels) for m in kept):
            api.silence(
                cfg,
                dict(labels),
                lasting=SESSION,
                created_by=SILENCER,
                comment="left by an earlier lab test",
            )
            kept.append(set(labels))
