"""The README's main command: the lab, a training job, a GPU fault, the alert it becomes,
slurmedic's recommendation with its dry-run commands (monitor mode: recorded, Slurm untouched)
and the diagnostics of the node. It can be run again: it starts from healthy GPUs and nodes."""

from __future__ import annotations

import time

from rich.console import Console

from lab import api, manage, monitoring, stacks
from lab.config import LabConfig
from lab.processes import wait_until
from lab.slurm import LabError, slurm
from webhook.ledger.store import Ledger
from webhook.service.config import load_config

DEMO_XID = 79  # "GPU has fallen off the bus": NVIDIA's catalog says RESTART_BM


def run(cfg: LabConfig, console: Console, *, nodes: int = 4, timeout: float = 60.0) -> None:
    console.rule("1. the lab, and slurmedic in monitor mode")
    if not stacks.get(cfg.stack).built():
        console.print(f"building the {cfg.stack} stack (once; about a minute) ...")
    seconds = manage.up(cfg)
    release = slurm(cfg, "scontrol", "--version").split()[-1]
    console.print(
        f"8-node Slurm {release} cluster and monitoring stack ({cfg.stack} stack) "
        f"ready in {seconds:.1f}s"
    )
    manage.clear(cfg)  # a demo starts from healthy GPUs ...
    # ... and free nodes: an earlier demo's job trains until cancelled.
    slurm(cfg, "scancel", "--name=demo-pretrain", check=False)
    if not wait_until(lambda: not slurm(cfg, "squeue", "-h", "--name=demo-pretrain"), 30, 0.5):
        raise LabError("an earlier demo job did not leave the queue within 30s")
    monitoring.start_slurmedic(cfg)
    console.print(f"slurmedic serves the lab's Alertmanager at {cfg.url(cfg.receiver_port)}")

    console.rule("2. a training job")
    job = manage.submit_training(cfg, nodes=nodes, name="demo-pretrain")
    if not wait_until(
        lambda: len(api.query(cfg, f'training_step{{slurm_job_id="{job}"}} > 0')) == nodes,
        timeout,
        0.5,
    ):
        raise LabError(f"job {job} did not report progress to Prometheus within {timeout:.0f}s")
    job_nodes, attempt = manage.running_job(cfg, job)
    console.print(f"job {job} runs on {', '.join(job_nodes)}; its progress is in Prometheus:")
    for s in api.query(cfg, f'training_step{{slurm_job_id="{job}"}}'):
        console.print(
            f"  rank {s['labels']['rank']} on {s['labels']['node']}: step {s['value']:.0f}"
        )

    console.rule("3. a GPU falls off the bus")
    victim = job_nodes[1]
    t0 = time.monotonic()
    manage.inject_gpu(cfg, "xid", victim, 3, xid=DEMO_XID)
    console.print(f"injected XID {DEMO_XID} on {victim} GPU 3 (fake dcgm-exporter)")

    console.rule("4. the alert")
    found: list[dict] = []  # type: ignore[type-arg]

    def arrived() -> bool:
        found[:] = api.alerts(cfg, alertname="GpuXidNodeFault", node=victim)
        return bool(found)

    if not wait_until(arrived, timeout, 0.2):
        raise LabError(
            f"no GpuXidNodeFault alert for {victim} in Alertmanager after {timeout:.0f}s"
        )
    alert = found[0]
    labels = alert["labels"]
    console.print(
        f"Alertmanager holds [bold]{labels['alertname']}[/bold] "
        f"{time.monotonic() - t0:.1f}s after the fault:"
    )
    for key in ("node", "gpu", "xid", "slurm_job_id", "signal", "severity"):
        console.print(f"  {key:13} {labels.get(key, '-')}")
    console.print(f"  summary       {alert['annotations'].get('summary', '')}")

    console.rule("5. slurmedic's recommendation")
    ledger = Ledger(load_config(cfg.slurmedic_config).database_url)
    incident = f"{job}.{attempt}"
    rows: list = []  # type: ignore[type-arg]

    def decided() -> bool:
        rows[:] = ledger.incident_decisions(incident)
        return bool(rows)

    if not wait_until(decided, timeout, 0.3):
        raise LabError(f"slurmedic recorded no decision for incident {incident} in {timeout:.0f}s")
    decided_after = time.monotonic() - t0

    def dry_runs() -> bool:
        # The executor has had its say on each: a dry run, or "no scheduler action" for an
        # escalation (which has no dry run to wait for).
        found = [ledger.decision(r.id) for r in rows]
        return all(f and any(e.detail.get("by") == "executor" for e in f[1]) for f in found)

    wait_until(dry_runs, timeout, 0.3)
    for r in sorted(rows, key=lambda r: r.id):
        target = ", ".join(r.nodes) or (f"excluding {', '.join(r.exclude)}" if r.exclude else "")
        console.print(f"  [bold]{r.action}[/bold] {target}  ({r.cause}, {r.mode}: {r.state})")
        history = ledger.decision(r.id)
        for e in history[1] if history else []:
            for cmd in e.detail.get("dry_run", {}).get("commands", []):
                console.print(
                    f"      would run: {cmd}", markup=False, highlight=False, soft_wrap=True
                )
    console.print(f"  reason: {rows[0].reason}")
    console.print(
        f"  decided {decided_after:.1f}s after the fault (the lab's settle window is 5 s); Slurm "
        "was not touched: monitor mode runs the playbooks in check mode only."
    )

    console.rule("6. diagnostics of the node (read-only, collected in monitor mode too)")
    drain = next((r for r in rows if r.action == "drain"), None)
    diag: list = []  # type: ignore[type-arg]

    def collected() -> bool:
        found = ledger.decision(drain.id) if drain else None
        diag[:] = [e.detail["diagnostics"] for e in (found[1] if found else [])
                   if "diagnostics" in e.detail]  # fmt: skip
        return bool(diag)

    if drain is not None and wait_until(collected, timeout, 0.5):
        for node, d in sorted(diag[0].get("nodes", {}).items()):
            console.print(f"  {node}: [bold]{d.get('verdict')}[/bold]  {d.get('artifacts', '')}")
            for line in d.get("summary", [])[:2] + [
                ln for ln in d.get("summary", []) if ln.startswith(("- ", "nvidia-smi:"))
            ]:
                console.print(f"      {line}", markup=False, highlight=False)
    console.print("  .venv/bin/slurmedic decisions list --config " + str(cfg.slurmedic_config))

    console.rule("the lab keeps running")
    console.print(
        f"Prometheus   {cfg.prometheus_url}\nAlertmanager {cfg.alertmanager_url}\n"
        "Undo the fault: .venv/bin/slurmedic lab clear\n"
        "Stop the lab:   .venv/bin/slurmedic lab down"
    )
