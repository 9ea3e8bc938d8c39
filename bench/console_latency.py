"""From a fault to what a human sees, in the lab, approve mode: fault injected -> its incident
listed in the console's approval queue -> its page showing the exact drain command (the dry
run) -> its notice in Alertmanager. And for an escalation (an application XID on a job that
keeps training: slurmedic hands it to a human): fault -> SlurmedicEscalation in Alertmanager
-> resolved there once a verdict is recorded in the console.

Brings up a lab of its own (port base 24000), runs `slurmedic serve` in approve mode, logs into
the console over HTTP as the lab's approver (the pages a browser would get), and for each round
submits a training job, injects XID 79 on one of its nodes and polls. The incident is rejected
from the console at the end of the round, so nothing waits into the next.

    .venv/bin/python -m bench.console_latency [--rounds 3] [--settle 5]
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable

import requests

from bench.lablib import enforcing_lab, finish_round, report, running_nodes, wait
from lab import api, manage, monitoring
from lab.config import LabConfig
from webhook.ledger.store import Ledger

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def login(cfg: LabConfig) -> requests.Session:
    s = requests.Session()
    page = s.get(f"{cfg.console_url}login", timeout=10).text
    form = {
        "user": "approver",
        "password": monitoring.console_password(cfg, "approver"),
        "csrf_token": TOKEN.search(page).group(1),  # type: ignore[union-attr]
    }
    s.post(f"{cfg.console_url}login", data=form, timeout=10).raise_for_status()
    return s


def one_round(cfg: LabConfig, ledger: Ledger, s: requests.Session) -> dict[str, float]:
    job = manage.submit_training(cfg, nodes=2, step_time=0.2)
    nodes = running_nodes(cfg, job)
    wait(lambda: api.query(cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}'))
    incident = f"{job}.0"
    page = f"{cfg.console_url}incident/{incident}"
    command = f"scontrol update nodename={nodes[0]} state=drain"
    probes: dict[str, Callable[[], bool]] = {
        "listed": lambda: (
            f'href="/console/incident/{incident}"' in s.get(cfg.console_url, timeout=10).text
        ),
        "commands": lambda: command in s.get(page, timeout=10).text,
        "notice": lambda: bool(
            api.alerts(cfg, alertname="SlurmedicAwaitingApproval", incident=incident)
        ),
    }
    seen: dict[str, float] = {}
    t_fault = time.time()
    manage.inject_gpu(cfg, "xid", nodes[0], 0, xid=79)

    def all_seen() -> bool:
        # Each probe in turn, every round, so each figure is when its own event was first
        # seen (not after the one before it).
        for name, probe in probes.items():
            if name not in seen and probe():
                seen[name] = time.time()
        return len(seen) == len(probes)

    wait(all_seen)
    html = s.get(page, timeout=10).text
    form = {"csrf_token": TOKEN.search(html).group(1), "reason": "bench"}  # type: ignore[union-attr]
    s.post(f"{page}/reject", data=form, timeout=10).raise_for_status()
    finish_round(cfg, ledger, job, nodes[0])
    return {name: at - t_fault for name, at in seen.items()}


def escalation_round(cfg: LabConfig, ledger: Ledger, s: requests.Session) -> dict[str, float]:
    job = manage.submit_training(cfg, nodes=2, step_time=0.2)
    nodes = running_nodes(cfg, job)
    wait(lambda: api.query(cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}'))
    incident = f"{job}.0"
    notice = {"alertname": "SlurmedicEscalation", "incident": incident}
    t_fault = time.time()
    manage.inject_gpu(cfg, "xid", nodes[0], 0, xid=13)
    wait(lambda: bool(api.alerts(cfg, **notice)), timeout=120)
    t_notice = time.time()
    (esc,) = [r for r in ledger.incident_decisions(incident) if r.action == "escalate"]
    html = s.get(f"{cfg.console_url}incident/{incident}", timeout=10).text
    form = {"csrf_token": TOKEN.search(html).group(1), "verdict": "agree", "note": "bench"}  # type: ignore[union-attr]
    t_verdict = time.time()
    s.post(f"{cfg.console_url}decision/{esc.id}/verdict", data=form, timeout=10).raise_for_status()
    wait(lambda: not api.alerts(cfg, **notice), timeout=120)
    t_resolved = time.time()
    finish_round(cfg, ledger, job, nodes[0])
    return {"escalation": t_notice - t_fault, "resolved": t_resolved - t_verdict}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--settle", type=float, default=5.0)
    args = p.parse_args()
    with enforcing_lab(24000, args.settle, mode="approve") as (cfg, ledger):
        session = login(cfg)
        rows = [one_round(cfg, ledger, session) for _ in range(args.rounds)]
        escalations = [escalation_round(cfg, ledger, session) for _ in range(args.rounds)]
    print(
        f"{len(rows)} rounds, XID 79 in approve mode, settle {args.settle:g}s: seconds from the "
        "fault until"
    )
    report(
        rows,
        {
            "listed": "its incident is in the console's queue",
            "commands": "its page shows the drain command (dry run)",
            "notice": "its notice is in Alertmanager",
        },
    )
    print(f"{len(escalations)} rounds, XID 13 on a training job (escalated): seconds until")
    report(
        escalations,
        {
            "escalation": "from the fault: SlurmedicEscalation is in Alertmanager",
            "resolved": "from the console's verdict: it is resolved in Alertmanager",
        },
    )


if __name__ == "__main__":
    main()
