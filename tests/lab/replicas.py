"""Several `slurmedic serve` replicas on one PostgreSQL ledger in the lab, and what their
tests ask of them: who leads, what each decision's claims were, what Slurm did."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from lab import api, manage, monitoring, postgres, processes
from lab.config import LabConfig
from lab.slurm import slurm
from tests.lab.conftest import (
    eventually,
    job_story,
    lab_policy,
    next_attempt,
    scrape,
    start_afresh,
)
from tests.lab.test_remediation import failures, heal
from webhook.core.lifecycle import RUNNING
from webhook.ledger.schema import DecisionRow
from webhook.ledger.store import Ledger

LEASE = 5.0  # seconds: a killed leader is replaced within about this long


@dataclass
class Replicas:
    cfg: LabConfig
    ledger: Ledger
    ports: dict[str, int]  # replica name: its port
    argv: dict[str, list[str]]
    disks: dict[str, Disk]  # each replica's TMPDIR
    sends_failed_before: int = 0  # Alertmanagers' failed sends to slurmedic at the start
    paused_at: float = 0.0  # when `paused_after` last paused a replica (time.monotonic())

    def daemon(self, name: str) -> str:
        return "slurmedic" if name == "a" else f"slurmedic-{name}"

    def others(self, name: str) -> list[str]:
        return [n for n in self.ports if n != name]

    def readyz(self, name: str, timeout: float = 5) -> dict[str, Any]:
        r = requests.get(f"{self.cfg.url(self.ports[name])}/readyz", timeout=timeout)
        body: dict[str, Any] = r.json()
        return body | {"code": r.status_code}

    def leader(self, *, not_: str | None = None, timeout: float = 60) -> str:
        """The replica every answering replica names as leader, and `not_` if given (a killed
        replica names no one): waits until they agree."""

        def agreed() -> str:
            seen = set()
            for n in self.ports:
                try:
                    # Briefly: a paused replica answers nothing, and waiting out a long
                    # timeout on it would make a takeover look seconds later than it was.
                    seen.add(self.readyz(n, timeout=0.5)["leader"])
                except requests.RequestException:
                    continue
            one = seen.pop() if len(seen) == 1 else None
            return one if one is not None and one != not_ else ""

        return str(eventually(agreed, timeout=timeout, what="the replicas naming one leader"))

    def pause(self, name: str, stopped: bool) -> None:
        """SIGSTOP (or SIGCONT) of the whole replica, webhook and loop: a VM paused, a process
        stuck in the kernel."""
        pid = processes.read_pid(self.cfg, self.daemon(name))
        assert pid is not None
        os.killpg(pid, signal.SIGSTOP if stopped else signal.SIGCONT)

    def pause_tree(self, name: str, stopped: bool, pids: list[int] | None = None) -> list[int]:
        """SIGSTOP (or SIGCONT) of the replica's whole process tree: serve, its loop and the
        playbook runs the loop started (each in a session of its own), as a VM pause stops
        them all. Returns the processes stopped (pass them back to continue them)."""
        root = processes.read_pid(self.cfg, self.daemon(name))
        assert root is not None
        sig = signal.SIGSTOP if stopped else signal.SIGCONT
        if pids is None:
            pids = [root]
            for _ in range(3):  # a process forked while the tree was being stopped
                for pid in [root, *processes.descendants(root)]:
                    if pid not in pids:
                        pids.append(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def runs(self, name: str) -> list[Path]:
        """The replica's playbook runs in progress (their private data directories)."""
        return sorted(self.disks[name].path.glob("slurmedic-run-*"))

    def start(self, name: str) -> None:
        env = self.cfg.env() | {"TMPDIR": str(self.disks[name].path)}
        processes.start(self.cfg, self.daemon(name), self.argv[name], env=env)
        eventually(lambda: self.readyz(name)["code"] == 200, timeout=60, what=f"{name} ready")

    def kill(self, name: str) -> None:
        """kill -9 of the replica's serve, its web workers and its loop at once."""
        pid = processes.read_pid(self.cfg, self.daemon(name))
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        eventually(lambda: not processes.group_members(pid), what=f"{name} gone")
        processes.stop(self.cfg, self.daemon(name))  # forget its pid file

    def metric(self, name: str, family: str, **labels: str) -> float:
        samples = scrape(f"{self.cfg.url(self.ports[name])}/metrics").get(family, [])
        for have, value in samples:
            if labels.items() <= have.items():
                return float(value)
        raise AssertionError(f"{family} {labels} not in {name}'s /metrics")


def event_of(path: Path) -> dict[str, Any] | None:
    """A playbook run's event (ansible-runner writes each to a file of its own; None while it
    is being written)."""
    try:
        event = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return event if isinstance(event, dict) else None


def paused_after(r: Replicas, name: str, argv: list[str], timeout: float = 120) -> list[int]:
    """Pause replica `name`'s whole tree the moment one of its playbook runs has carried out
    `argv` (a plan's read of Slurm, as the run itself reports it: where a real pause could
    fall); the processes stopped."""
    seen: set[Path] = set()

    def read_done() -> bool:
        for run in r.runs(name):
            for path in run.glob("artifacts/*/job_events/*.json"):
                if path in seen or (event := event_of(path)) is None:
                    continue
                seen.add(path)
                res = event.get("event_data", {}).get("res", {})
                # A looped task's items report each of theirs.
                done = event.get("event") in ("runner_on_ok", "runner_item_on_ok")
                if done and res.get("cmd") == argv:
                    return True
        return False

    # The event is the run's own; polled often, the act being a few tasks later.
    eventually(read_done, timeout=timeout, interval=0.005, what=f"a run of {name} doing {argv}")
    stopped = r.pause_tree(name, True)
    r.paused_at = time.monotonic()
    return stopped


def mended(cfg: LabConfig, node: str) -> None:
    """A person mends `node` and puts it back in service: its fault cleared, and its GPU alerts
    resolved first (resumed while one still fires, slurmedic rightly drains it again)."""
    manage.clear(cfg, node)
    eventually(
        lambda: not [a for a in api.alerts(cfg, signal="gpu_hw") if node in a["labels"].values()],
        timeout=120,
        what=f"{node}'s GPU alerts resolved",
    )
    slurm(cfg, "scontrol", "update", f"nodename={node}", "state=resume")


def deliver_to(cfg: LabConfig, ports: list[int]) -> None:
    """Every Alertmanager's slurmedic receiver sends every notification to each of `ports`."""
    config = monitoring.alertmanager_config(cfg)
    for receiver in config["receivers"]:
        if receiver["name"] == "slurmedic":
            hook = receiver["webhook_configs"][0]
            receiver["webhook_configs"] = [
                {**hook, "url": f"{cfg.url(p)}/api/v1/alerts"} for p in ports
            ]
    (cfg.etc / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    monitoring.reload_alertmanagers(cfg)


@dataclass
class Disk:
    """A replica's own small disk (a tmpfs, its TMPDIR: where its playbook runs are prepared),
    which a test can fill up as a real disk fills: writes fail with ENOSPC."""

    path: Path
    size_mb: int = 64

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=1777", "tmpfs",
             str(self.path)],
            check=True,
            capture_output=True,
        )  # fmt: skip

    def fill(self) -> None:
        """Write until the disk is full."""
        with (self.path / "filler").open("ab") as f:
            chunk = bytes(1024 * 1024)
            with contextlib.suppress(OSError):
                while True:
                    f.write(chunk)
                    f.flush()

    def free(self) -> None:
        (self.path / "filler").unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)


@contextlib.contextmanager
def replicas(cfg: LabConfig, tmp: Path, names: str, database: str) -> Iterator[Replicas]:
    """`slurmedic serve` replicas `names` (a, b, ...) in enforce mode on a new PostgreSQL
    database, Alertmanager delivering every notification to each."""
    processes.stop(cfg, "slurmedic")
    start_afresh(cfg)  # earlier tests' alerts are silenced
    postgres.start(cfg)
    url = postgres.new_database(cfg, database)
    policy = lab_policy(tmp, "enforce")
    ports = {name: cfg.receiver_port + i for i, name in enumerate(names)}
    argv = {}
    for name, port in ports.items():
        config = monitoring.slurmedic_config(cfg) | {
            "listen": f"127.0.0.1:{port}",
            "database_url": url,
            "policy_file": str(policy),
            "replicas": {"name": name, "lease_seconds": LEASE},
        }
        path = tmp / f"config-{name}.yml"
        path.write_text(yaml.safe_dump(config))
        argv[name] = [cfg.python, "-m", "webhook.cli", "serve", f"--config={path}"]
    disks = {name: Disk(tmp / f"disk-{name}") for name in ports}
    r = Replicas(cfg, Ledger(url), ports, argv, disks)
    deliver_to(cfg, list(ports.values()))
    try:
        for disk in disks.values():
            disk.mount()
        for name in ports:
            r.start(name)
        r.sends_failed_before = sends_failed(cfg)
        yield r
    finally:
        for name in ports:
            processes.stop(cfg, r.daemon(name))
        for disk in disks.values():
            disk.unmount()
        deliver_to(cfg, [cfg.receiver_port])
        heal(cfg)


def why(pair: Replicas, job: int) -> str:
    """What the replicas, the ledger and Alertmanager hold: a failure's message."""
    lines = [f"{n}: {pair.readyz(n)}" for n in pair.ports]
    lines += [f"decision {r.id} {r.incident} {r.action} {r.state}" for r in pair.ledger.decisions()]
    stored = pair.ledger.alerts_after(0)
    lines.append(f"{len(stored)} alert events stored; last:")
    lines += [f"  {a.status} {dict(a.labels)}" for _, _, a in stored[-5:]]
    lines += [
        f"AM: {a['labels']} {a['status']}" for a in api.alerts(pair.cfg, slurm_job_id=str(job))
    ]
    return "\n".join(lines)


def waiting(pair: Replicas, job: int, probe: Callable[[], Any], what: str, **kw: Any) -> Any:
    try:
        return eventually(probe, what=what, **kw)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{why(pair, job)}") from None


def incident_rows(ledger: Ledger, incident: str) -> list[DecisionRow]:
    return [r for r in ledger.decisions(500) if r.incident == incident]


def act_windows(ledger: Ledger, rows: dict[str, DecisionRow]) -> list[float]:
    """Each act's time from its last check to its command's end, as the runs recorded it."""
    return [
        w
        for row in rows.values()
        for e in (ledger.decision(row.id) or (row, []))[1]
        for w in e.detail.get("run", {}).get("windows_ms", [])
    ]


def claims(ledger: Ledger, row: DecisionRow) -> list[dict[str, Any]]:
    found = ledger.decision(row.id)
    assert found is not None
    return [e.detail for e in found[1] if e.state == RUNNING]


def carried_out(
    ledger: Ledger, incident: str, *, others: bool = False
) -> Callable[[], dict[str, DecisionRow]]:
    """The incident's drain and requeue once both are final; `others`: beside decisions of
    other actions (a bench's later rounds on the same ledger, where the node's failures
    repeat and are escalated too)."""

    def done() -> dict[str, DecisionRow]:
        rows = {
            r.action: r
            for r in incident_rows(ledger, incident)
            if not others or r.action in ("drain", "requeue")
        }
        ready = set(rows) == {"drain", "requeue"} and all(
            r.state in ("executed", "failed") for r in rows.values()
        )
        return rows if ready else {}

    return done


def executed_once(pair: Replicas, incident: str, rows: dict[str, DecisionRow]) -> None:
    """The incident's drain and requeue executed, and the ledger holds one decision of each."""
    assert {a: r.state for a, r in rows.items()} == {
        "drain": "executed",
        "requeue": "executed",
    }, failures(pair.ledger, rows)
    assert sorted(r.action for r in incident_rows(pair.ledger, incident)) == ["drain", "requeue"]


def restarted_once(cfg: LabConfig, job: int, drained: str) -> None:
    """Slurm runs the job's next attempt, and restarted it once, whoever requeued it; its log
    shows one requeue of the job and one slurmedic drain of `drained`."""
    next_attempt(cfg, job, 1)
    assert slurm_actions(cfg, job, drained) == (1, 1), job_story(cfg, job)


def slurm_actions(cfg: LabConfig, job: int, node: str) -> tuple[int, int]:
    """How many times Slurm requeued `job` and set slurmedic's drain reason for it on `node`,
    by slurmctld's own log: a double action is seen here whoever sent it."""
    text = (cfg.logs / "slurmctld.log").read_text(errors="replace")
    requeues = len(re.findall(rf"Requeuing JobId={job}\b", text))
    drains = len(re.findall(rf"node {node} reason set to: slurmedic: {job}\.0 ", text))
    return requeues, drains


def fired_for(cfg: LabConfig, job: int) -> list[dict[str, str]]:
    """Every alert for slurmedic that fired about `job` in this test, by Prometheus' own record
    (ALERTS): Alertmanager forgets an alert once it resolved, as this one does when the job
    moves off the node."""
    found = api.query(
        cfg, f'last_over_time(ALERTS{{alertstate="firing",signal!="",slurm_job_id="{job}"}}[15m])'
    )
    return [
        {k: v for k, v in r["labels"].items() if k not in ("__name__", "alertstate")} for r in found
    ]


def unstored(r: Replicas, job: int) -> list[dict[str, str]]:
    """Alerts that fired about `job` of which the ledger holds no event (lost, or not sent yet).
    Alertmanager adds the external labels; the ledger's labels hold Prometheus' and those."""
    stored = [a.labels for _, _, a in r.ledger.alerts_after(0)]
    return [
        labels
        for labels in fired_for(r.cfg, job)
        if not any(labels.items() <= have.items() for have in stored)
    ]


def answered(r: Replicas, family: str, keep: Callable[[dict[str, str]], bool]) -> float:
    """A webhook counter summed over the replicas' /metrics, over the samples `keep` takes (a
    replica that is down, killed by a fault, counts nothing: its counters went with it)."""
    total = 0.0
    for port in r.ports.values():
        try:
            samples = scrape(f"{r.cfg.url(port)}/metrics").get(family, [])
        except requests.ConnectionError:
            continue
        for labels, value in samples:
            if keep(labels):
                total += value
    return total


def sends_failed(cfg: LabConfig) -> int:
    """Notifications to slurmedic the lab's Alertmanagers gave up on after their retries, by
    their own logs (their metrics do not name the receiver; the lab's `oncall` receiver fails
    by design). Each is sent again at the group's next interval."""
    return sum(
        sum(
            1
            for line in log.read_text(errors="replace").splitlines()
            if "Notify for alerts failed" in line and "slurmedic/webhook[" in line
        )
        for log in cfg.logs.glob("alertmanager*.out")
    )


def table_row(fault: str, r: Replicas, job: int, drained: str, back: float) -> dict[str, object]:
    """The fault table's row for a job's fault, printed: the fault tests assert on it,
    bench.faults sums it."""
    fired = fired_for(r.cfg, job)
    requeues, drains = slurm_actions(r.cfg, job, drained)
    row: dict[str, object] = {
        "fault": fault,
        "alerts fired": len(fired),
        "not in the ledger": len(unstored(r, job)),
        "new events acknowledged": answered(
            r, "slurmedic_webhook_alerts_total", lambda lb: lb.get("outcome") == "new"
        ),
        "events stored": len(r.ledger.alerts_after(0)),
        "Alertmanager sends failed": sends_failed(r.cfg) - r.sends_failed_before,
        "answers 5xx": answered(
            r, "slurmedic_webhook_requests_total", lambda lb: lb.get("code", "").startswith("5")
        ),
        "Slurm requeues": requeues,
        "Slurm drains": drains,
        "decisions": len(incident_rows(r.ledger, f"{job}.0")),
        "seconds to a leader": round(back, 1),
    }
    print("fault table:", row)
    return row


def leads_again(r: Replicas, since: float, *, not_: str | None = None) -> float:
    """Seconds from `since` until the replicas name one leader (not `not_`) and it says so."""
    leader = r.leader(not_=not_, timeout=4 * LEASE + 60)
    eventually(lambda: r.readyz(leader)["leading"], timeout=60, what=f"{leader} leading")
    return time.monotonic() - since


def all_stored(r: Replicas, job: int) -> None:
    """Wait until every alert that fired about the job reached the ledger (sent again after a
    fault, where an answer was an error or none came)."""
    waiting(
        r,
        job,
        lambda: fired_for(r.cfg, job) and not unstored(r, job),
        "every alert stored",
        timeout=60,
    )


POINTS = ("alert", "decided", "running")


def reached(r: Replicas, job: int, point: str) -> Any:
    """Wait for a point in the handling of the job's fault: its alert in Alertmanager, its
    first decision recorded, a decision running (a playbook in flight); what was seen."""
    incident = f"{job}.0"
    probes: dict[str, Callable[[], Any]] = {
        "alert": lambda: api.alerts(r.cfg, slurm_job_id=str(job), signal="gpu_hw"),
        "decided": lambda: incident_rows(r.ledger, incident),
        "running": lambda: [x for x in incident_rows(r.ledger, incident) if x.state == RUNNING],
    }
    return waiting(r, job, probes[point], point, timeout=90, interval=0.05)
