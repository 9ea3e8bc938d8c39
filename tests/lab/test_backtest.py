"""`slurmedic backtest` over a scripted stretch of the lab's real history: faults with what a
person did about them, read back from the lab's Prometheus (the ALERTS its rules wrote) and its
Slurm accounting (slurmdbd: sacct, sacctmgr show event), on each stack.

The script (a compressed hour; every step waits for the event it needs):
1. a GPU falls off the bus under job A and A dies; the person `ops` drains the node with a
   reason of their own, and its user resubmits A under the same name;
2. a node dies under job B (submitted `--no-requeue`): Slurm marks it down; nobody acts;
3. `ops` drains an idle node for maintenance, no alert about it, and resumes it.
The backtest must report each of them right, and its scenario must replay to the same decisions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from lab import manage, monitoring, person
from lab.config import LabConfig
from lab.slurm import slurm
from tests.lab.conftest import (
    eventually,
    lab_policy,
    node_events,
    node_story,
    query,
    running_nodes,
    serve_slurmedic,
)
from tests.lab.test_console_browser import page, shot
from tests.lab.test_remediation import healthy_after, mapped, restore
from webhook.core import durations
from webhook.ledger.store import Ledger

pytestmark = pytest.mark.lab
__all__ = ["healthy_after", "page"]  # fixtures: a healthy cluster after; a real browser

MAINTENANCE = "gpu08"  # the debug partition's: idle while the train jobs run


@pytest.fixture
def monitor(lab_cfg: LabConfig, tmp_path: Path) -> Iterator[Ledger]:
    """The service beside the backtest (monitor mode, a new ledger): where `--save` keeps the
    report for the console."""
    yield serve_slurmedic(lab_cfg, tmp_path, "monitor")
    restore(lab_cfg)


def iso(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def sacct_state(cfg: LabConfig, job: int) -> str:
    out = slurm(cfg, "sacct", "-X", "-n", "-P", "-D", "-j", str(job), "-o", "State", check=False)
    return out.splitlines()[-1].strip() if out.strip() else ""


def event_of(cfg: LabConfig, node: str, reason: str, ended: bool) -> bool:
    return any(
        e.reason == reason and (not ended or e.end is not None) for e in node_events(cfg, node)
    )


def firing(cfg: LabConfig, alertname: str, node: str) -> bool:
    sel = f'alertname="{alertname}",alertstate="firing",node="{node}"'
    return bool(query(cfg, f"ALERTS{{{sel}}}"))


def fired_for(cfg: LabConfig, alertname: str, node: str) -> float:
    """About how long (seconds) the alert has fired: its evaluations firing, times the lab's
    evaluation interval."""
    sel = f'alertname="{alertname}",alertstate="firing",node="{node}"'
    r = query(cfg, f"max(count_over_time(ALERTS{{{sel}}}[5m]))")
    every = durations.parse(cfg.evaluation_interval).total_seconds()
    return float(r[0]["value"]) * every if r else 0.0


def slurmedic_backtest(
    cfg: LabConfig, tmp: Path, start: datetime, end: datetime, *args: str
) -> subprocess.CompletedProcess[str]:
    """`slurmedic backtest` of the span with the lab tests' policy, as an operator runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "backtest",
            f"--prometheus={cfg.prometheus_url}",
            f"--from={iso(start)}",
            f"--to={iso(end)}",
            f"--policy={lab_policy(tmp, 'monitor')}",
            *args,
        ],
        env=cfg.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def backtest(cfg: LabConfig, tmp: Path, start: datetime, end: datetime) -> dict[str, Any]:
    """The report as JSON, the scenario's replay beside it; kept in slurmedic's ledger too
    (`--save`, for the console), as an operator would run it beside the service."""
    scenario = tmp / "scenario.yml"
    proc = slurmedic_backtest(
        cfg,
        tmp,
        start,
        end,
        "--format=json",
        f"--scenario-out={scenario}",
        f"--config={cfg.slurmedic_config}",
        "--save",
    )
    assert proc.returncode == 0, proc.stderr
    assert "kept as backtest" in proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    replayed = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "replay", str(scenario), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report["replayed"] = json.loads(replayed.stdout)["decisions"]
    # The same report for people (markdown), kept beside the screenshots when asked.
    md = tmp / "backtest.md"
    again = slurmedic_backtest(cfg, tmp, start, end, "--format=md", f"--out={md}")
    assert again.returncode == 0, again.stderr
    report["markdown"] = md.read_text()
    if target := os.environ.get("SLURMEDIC_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(md, Path(target) / md.name)
    return report


def verdicts(report: dict[str, Any], incident: str) -> dict[tuple[str, tuple[str, ...]], dict]:
    """The incident's verdicts by (action, nodes); the whole report when it is not there."""
    rows = [i for i in report["incidents"] if i["incident"] == incident]
    assert len(rows) == 1, f"no incident {incident}: {json.dumps(report, indent=1)[:8000]}"
    return {(v["action"], tuple(v["nodes"])): v for v in rows[0]["verdicts"]}


def test_the_backtest_reports_each_fault_and_each_thing_people_did(
    lab_cfg: LabConfig, submit: Callable[..., int], tmp_path: Path, page: Page, monitor: Ledger
) -> None:
    cfg = lab_cfg
    user = person.PERSON
    # An earlier test's alert still firing when the stretch starts (an XID it cleared fires on
    # until its window passes) is an earlier fault: the backtest leaves it out, and says so.
    # One still pending would fire inside the stretch, as a fault of its own: none is left.
    manage.clear(cfg)
    eventually(
        lambda: not query(cfg, 'ALERTS{signal!="",alertstate="pending"}'),
        timeout=120,
        what="no earlier alert pending",
    )
    earlier = len(query(cfg, 'ALERTS{signal!="",alertstate="firing"}'))
    start = datetime.now(UTC)

    # 1. A GPU falls off the bus under A, which dies of it; the person drains the node later,
    #    with their own reason, and A's user submits it again.
    a = submit(nodes=2, name="pretrain-a", steps=100000)
    nodes_a = running_nodes(cfg, a)
    mapped(cfg, a)
    bad = nodes_a[1]
    manage.inject_gpu(cfg, "xid", bad, 3, xid=79)
    manage.inject_job(cfg, "crash_ecc", a, rank=1)
    eventually(lambda: firing(cfg, "GpuXidNodeFault", bad), timeout=60, what="the XID alert")
    eventually(lambda: sacct_state(cfg, a) == "FAILED", timeout=60, what="A failed")
    # The person comes to it later than slurmedic's settle window (5 s) would have: the alert
    # has fired for 15 s when they act.
    eventually(
        lambda: fired_for(cfg, "GpuXidNodeFault", bad) >= 15, timeout=60, what="a late person"
    )
    manage.drain_as(cfg, user, bad, "bad HBM")
    again = submit(nodes=2, name="pretrain-a", steps=100000)

    # 2. A node dies under B, which cannot be requeued; Slurm marks the node down.
    b = submit(nodes=2, name="finetune-b", requeue=False, steps=100000)
    nodes_b = running_nodes(cfg, b)
    mapped(cfg, b)
    dead = nodes_b[0]
    manage.kill_node(cfg, dead)
    eventually(lambda: firing(cfg, "SlurmNodeDown", dead), timeout=90, what="the node-down alert")
    eventually(lambda: sacct_state(cfg, b) == "NODE_FAIL", timeout=90, what="B lost its node")

    # 3. Maintenance no alert explains: the person resumes the node once its drain is on record
    #    (a drain and a resume in one second may leave accounting a zero-length event, or none).
    #    Accounting is written by slurmctld through slurmdbd, a little after the fact.
    manage.drain_as(cfg, user, MAINTENANCE, "firmware update")
    try:
        eventually(
            lambda: event_of(cfg, MAINTENANCE, "firmware update", ended=False),
            timeout=60,
            what="the maintenance drain recorded",
        )
        manage.resume_as(cfg, user, MAINTENANCE)
        eventually(
            lambda: event_of(cfg, MAINTENANCE, "firmware update", ended=True),
            timeout=60,
            what="the maintenance recorded",
        )
    except AssertionError as e:
        raise AssertionError(f"{e}\n{node_story(cfg, MAINTENANCE)}") from None
    eventually(lambda: event_of(cfg, bad, "bad HBM", ended=False), what="the drain recorded")
    eventually(lambda: event_of(cfg, dead, "Not responding", ended=False), what="the node down")
    eventually(lambda: sacct_state(cfg, again) == "RUNNING", what="the resubmission running")
    end = datetime.now(UTC) + timedelta(seconds=1)

    report = backtest(cfg, tmp_path, start, end)
    explain = json.dumps(report, indent=1)[:6000]

    # 1: slurmedic would have drained the node the person drained, and run A again as its
    #    user did; the GPU-hours are A's 2 nodes' GPUs for the time it would have gained.
    fault = verdicts(report, f"{a}.0")
    assert ("drain", (bad,)) in fault, explain
    drain = fault[("drain", (bad,))]
    assert drain["verdict"] == "agree", explain
    assert f"{user} drained it: bad HBM" in drain["note"], explain
    assert drain["gained_s"] > 0, explain
    requeue = fault[("requeue", ())]
    assert requeue["verdict"] == "agree" and "resubmitted" in requeue["note"], explain
    assert requeue["gained_s"] > 0 and requeue["gpu_hours_saved"] > 0, explain
    assert f"as job {again}" in json.dumps(report["incidents"]), explain
    # 2: Slurm had the node down (agreement); nobody ran B again (a possible false positive:
    #    the record cannot say whether B should have run again).
    lost = verdicts(report, f"{b}.0")
    assert lost[("drain", (dead,))]["verdict"] == "agree", explain
    assert "Slurm had it down" in lost[("drain", (dead,))]["note"], explain
    assert lost[("requeue", ())]["verdict"] == "possible_false_positive", explain
    # 3: the maintenance drain is a person's action no alert explains.
    assert [(u["what"], u["by"], u["nodes"], u["detail"]) for u in report["unanswered"]] == [
        ("drained", user, [MAINTENANCE], "firmware update")
    ], explain
    # Nothing else: no incident about a node nothing happened to.
    touched = {n for i in report["incidents"] for v in i["verdicts"] for n in v["nodes"]}
    assert touched <= {bad, dead}, explain
    c = report["counts"]
    assert (c["misses"], c["possible_false_positives"]) == (1, 1), explain
    # The scenario the history made replays to the same decisions.
    would = sorted(
        (d["at"], i["incident"], d["action"], tuple(d["nodes"]))
        for i in report["incidents"]
        for d in i["would"]
    )
    replayed = sorted(
        (d["at"], d["incident"], d["action"], tuple(d["nodes"]))
        for d in report["replayed"]
        if d["state"] != "superseded"
    )
    assert would == replayed
    assert any("annotations" in line for line in report["limits"])
    left_out = [line for line in report["limits"] if "already firing when the span" in line]
    assert left_out or not earlier, (earlier, report["limits"])
    md = report["markdown"]
    assert f"### {a}.0" in md and "bad HBM" in md and "firmware update" in md, md

    # The console shows it: the list of backtests, then the report, in a real browser.
    page.goto(cfg.console_url + "backtests")
    page.get_by_label("user").fill("viewer")
    page.get_by_label("password").fill(monitoring.console_password(cfg, "viewer"))
    page.get_by_role("button", name="log in").click()
    listed = page.locator("table.report")
    expect(listed).to_contain_text("policy-monitor.yml")  # the policy file it judged
    listed.locator("tbody tr").first.get_by_role("link").click()
    expect(page.get_by_role("heading", name=re.compile(r"^Backtest \d+"))).to_be_visible()
    fault, lost = page.locator(f"[id='incident-{a}.0']"), page.locator(f"[id='incident-{b}.0']")
    expect(fault).to_contain_text("bad HBM")
    expect(fault).to_contain_text("agrees")
    expect(lost).to_contain_text("possible false positive")
    expect(page.locator("body")).to_contain_text("firmware update")
    shot(page, tmp_path, "backtest")
