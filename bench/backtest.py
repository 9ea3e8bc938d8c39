"""The backtest over a synthetic month of a 2,048-node cluster, from the real parts: the alerts in a
real Prometheus TSDB (backfilled with `promtool tsdb create-blocks-from openmetrics`), the jobs
and node events in the lab's real accounting database (slurmdbd on MariaDB, read back with
`sacct --json` and `sacctmgr show event`). Prints the time and memory of each stage.

The history is bench/backtest_history.py's. Its rows go straight into slurmdbd's tables (the
only way to give accounting a month it did not live through), in the shape slurmdbd itself
writes them; the backtest then reads them through the Slurm commands like any site's.

    .venv/bin/python -m bench.backtest [--days 30] [--nodes 2048] [--faults 12]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import requests

from bench.backtest_history import History, generate
from lab import accounting, manage, person, processes
from lab.config import LabConfig
from lab.slurm import CLUSTER, LabError, slurm
from webhook.adapters.accounting import Accounting
from webhook.adapters.prometheus import Prometheus
from webhook.backtest import run as backtest
from webhook.backtest.compare import Report
from webhook.backtest.history import firing_spans

T = TypeVar("T")
PORT_BASE = 25000
# slurmdbd's job states (slurm.h's enum job_states, JOB_REQUEUE a flag) and node states.
JOB_STATE = {
    "RUNNING": 1,
    "COMPLETED": 3,
    "CANCELLED": 4,
    "FAILED": 5,
    "NODE_FAIL": 7,
    "REQUEUED": 1024,
}
NODE_DOWN, NODE_IDLE, NODE_DRAIN, NODE_NO_RESPOND = 1, 2, 0x200, 0x800
GPU_TRES = 1001  # tres_table's id of gres/gpu once the cluster registers it


def measured(what: str, fn: Callable[[], T]) -> T:
    t0 = time.perf_counter()
    out = fn()
    print(f"  {what:<44} {time.perf_counter() - t0:8.2f} s")
    return out


# ---- the accounting database ---------------------------------------------------------------


def _quote(v: Any) -> str:
    if isinstance(v, int):
        return str(v)
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _insert(table: str, rows: list[dict[str, Any]], required: dict[str, str]) -> Iterable[str]:
    """INSERTs of 500 rows each; columns slurmdbd requires that the rows do not name get the
    type's zero (the releases add some)."""
    if not rows:
        return
    extra = {c: ("0" if "int" in t else "''") for c, t in required.items() if c not in rows[0]}
    cols = [*rows[0], *extra]
    for i in range(0, len(rows), 500):
        values = ",".join(
            "(" + ",".join([*(_quote(r[c]) for c in rows[0]), *extra.values()]) + ")"
            for r in rows[i : i + 500]
        )
        yield f"INSERT INTO `{table}` ({','.join(f'`{c}`' for c in cols)}) VALUES {values};"


def _columns(cfg: LabConfig, table: str) -> list[str]:
    out = accounting.sql(
        cfg,
        "SELECT column_name FROM information_schema.columns WHERE "
        f"table_schema='{accounting.DATABASE}' AND table_name='{table}'",
    )
    return out.split()


def _required(cfg: LabConfig, table: str) -> dict[str, str]:
    """Columns that are NOT NULL without a default (or auto_increment): name -> type."""
    out = accounting.sql(
        cfg,
        "SELECT column_name, data_type FROM information_schema.columns WHERE "
        f"table_schema='{accounting.DATABASE}' AND table_name='{table}' AND is_nullable='NO' "
        "AND column_default IS NULL AND extra NOT LIKE '%auto_increment%'",
    )
    return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)


def fill_accounting(cfg: LabConfig, h: History) -> None:
    """The history's attempts and node events as slurmdbd's rows, replacing the cluster's."""
    jobs, events = f"{CLUSTER}_job_table", f"{CLUSTER}_event_table"
    # Each synthetic user is a Linux user (host and stack) with an association: sacct names a
    # job's user from its association.
    users = sorted({a.user for a in h.attempts})
    login = {u: f"bt-{u}" for u in users}
    uid = {u: person.ensure(cfg, login[u]).pw_uid for u in users}
    for name in login.values():
        slurm(
            cfg,
            "sacctmgr",
            "-i",
            "add",
            "user",
            name,
            f"Account={accounting.PEOPLE_ACCOUNT}",
            f"Cluster={CLUSTER}",
            check=False,
        )
    rows = accounting.sql(
        cfg,
        f"SELECT user, id_assoc FROM `{accounting.DATABASE}`.`{CLUSTER}_assoc_table` "
        "WHERE user <> '' AND deleted = 0",
    )
    assoc_of = dict(line.split("\t") for line in rows.splitlines() if "\t" in line)
    assoc = {u: int(assoc_of[login[u]]) for u in users}
    uid["ops"] = person.ensure(cfg).pw_uid
    uid["root"] = 0
    restart_cnt = "restart_cnt" in _columns(cfg, jobs)  # 24.11+ keep each run's count
    job_rows = []
    for a in h.attempts:
        start = int(a.started.timestamp()) if a.started else 0
        submit = int((a.submitted or a.started or h.start).timestamp())
        if a.attempt:  # slurmdbd stamps a requeued run's record with its requeue time
            submit = start
        job_rows.append(
            {
                "id_job": a.job,
                "id_assoc": assoc[a.user],
                "id_user": uid[a.user],
                "id_group": uid[a.user],
                "job_name": a.name,
                "partition": a.partition,
                "nodelist": _hostlist(a.nodes),
                "nodes_alloc": len(a.nodes),
                "cpus_req": 8 * len(a.nodes),
                "state": JOB_STATE[a.state],
                "exit_code": (a.exit_code or 0) << 8,
                "time_submit": submit,
                "time_eligible": submit,
                "time_start": start,
                "time_end": int(a.ended.timestamp()) if a.ended else 0,
                "tres_alloc": f"1={8 * len(a.nodes)},4={len(a.nodes)},{GPU_TRES}={a.gpus}",
                "id_resv": 0,
                "id_wckey": 0,
                "het_job_id": 0,
                "het_job_offset": 4294967294,
                "state_reason_prev": 0,
                "priority": 1,
                "mod_time": submit,
            }
        )
        if restart_cnt:
            job_rows[-1]["restart_cnt"] = a.attempt
    event_rows = []
    for e in h.events:
        state = (
            NODE_DOWN | NODE_NO_RESPOND if e.state.startswith("DOWN") else NODE_IDLE | NODE_DRAIN
        )
        event_rows.append(
            {
                "time_start": int(e.start.timestamp()),
                "time_end": int(e.end.timestamp()) if e.end else 0,
                "node_name": e.node,
                "cluster_nodes": "",
                "reason": e.reason,
                "reason_uid": uid.get(e.user, 0),
                "state": state,
                "tres": "1=8,1001=8",
            }
        )
    statements = [
        f"USE `{accounting.DATABASE}`;",
        f"DELETE FROM `{jobs}`;",
        f"DELETE FROM `{events}` WHERE node_name <> '';",
    ]
    statements += _insert(jobs, job_rows, _required(cfg, jobs))
    statements += _insert(events, event_rows, _required(cfg, events))
    proc = subprocess.run(
        ["mariadb", "--no-defaults", f"--socket={accounting.mariadb_socket(cfg)}", "--user=root"],
        input="\n".join(statements),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise LabError(f"filling the accounting database failed: {proc.stderr.strip()[:500]}")


def _hostlist(nodes: tuple[str, ...]) -> str:
    import hostlist

    return str(hostlist.collect_hostlist(list(nodes)))


# ---- the alerts in a real TSDB ---------------------------------------------------------------


def backfill_prometheus(cfg: LabConfig, h: History) -> tuple[str, Path]:
    """The history's ALERTS as TSDB blocks (promtool) under a Prometheus of the bench's own;
    its URL once it answers."""
    # Under the lab's run directory: a stack's promtool and prometheus see only that.
    work = cfg.run_dir / "bench"
    work.mkdir(parents=True, exist_ok=True)
    data, text = work / "tsdb", work / "alerts.om"
    with text.open("w") as f:
        f.writelines(h.openmetrics())
    env = cfg.env()
    proc = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(text), str(data)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise LabError(f"promtool backfill failed: {proc.stderr.strip()[-500:]}")
    config = work / "prometheus.yml"
    config.write_text("global: {evaluation_interval: 15s}\n")
    port = cfg.port_base + 97
    processes.start(
        cfg,
        "bench-prometheus",
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=3650d",
        ],
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return requests.get(f"{url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    if not processes.wait_until(ready, 120, 0.2):
        raise LabError(f"the bench's Prometheus did not start; see {cfg.logs}/bench-prometheus.out")
    return url, text


def _stages(prom: Prometheus, acct: Accounting, h: History, *, measure: bool) -> tuple[Report, str]:
    def step(what: str, fn: Callable[[], T]) -> T:
        return measured(what, fn) if measure else fn()

    start, until = h.start, h.until
    t0 = time.perf_counter()
    series = step(
        "alerts read (ALERTS, 6 h chunks)",
        lambda: prom.raw_samples("ALERTS", {"alertstate": "firing"}, start, until, backtest.CHUNK),
    )
    spans = step("firing spans", lambda: firing_spans(series, {}, backtest.DEFAULT_INTERVAL, until))
    attempts = step("jobs read (sacct --json)", lambda: acct.attempts(start, until))
    events = step("node events read (sacctmgr)", lambda: acct.node_events(start, until))
    inputs = backtest.Inputs(spans, attempts, events, h.shape, [])
    report, scenario = step("core and comparison", lambda: _run(inputs, h))
    if measure:
        print(f"  {'total':<44} {time.perf_counter() - t0:8.2f} s")
    return report, (
        f"read back: {len(spans)} alerts (of {len(h.alerts)}), {len(attempts)} attempts "
        f"(of {len(h.attempts)}), {len(events)} node events (of {len(h.events)}); "
        f"{len(scenario['events'])} scenario events; users {sorted({a.user for a in attempts})}"
    )


def _run(inputs: backtest.Inputs, h: History) -> tuple[Report, dict[str, Any]]:
    return backtest.run(
        inputs,
        start=h.start,
        until=h.until,
        policy=None,
        delay=timedelta(0),
        window=timedelta(hours=24),
    )


def _truth(h: History) -> Report:
    series: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for a in h.alerts:
        key = tuple(sorted({**a.labels, "alertstate": "firing"}.items()))
        series.setdefault(key, []).extend(t.timestamp() for t in a.samples())
    spans = firing_spans(
        [(dict(k), v) for k, v in series.items()], {}, backtest.DEFAULT_INTERVAL, h.until
    )
    return _run(backtest.Inputs(spans, h.attempts, h.events, h.shape, []), h)[0]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--faults", type=float, default=12.0, help="GPU faults a day")
    ap.add_argument("--port-base", type=int, default=PORT_BASE)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="slurmedic-bench-backtest-"))
    cfg = LabConfig(run_dir=work / "lab", port_base=args.port_base)
    print(f"backtest bench: {args.days} days, {args.nodes} nodes, stack {cfg.stack}")
    try:
        h = measured(
            "history generated",
            lambda: generate(nodes=args.nodes, days=args.days, gpu_faults=args.faults),
        )
        print(
            f"  ({len(h.alerts)} alerts, {len(h.attempts)} job attempts, "
            f"{len(h.events)} node events; people: {h.people})"
        )
        measured("lab up (Slurm, slurmdbd, MariaDB)", lambda: manage.up(cfg))
        measured("accounting database filled", lambda: fill_accounting(cfg, h))
        url, text = measured("alerts backfilled into a TSDB", lambda: backfill_prometheus(cfg, h))
        print(f"  ({text.stat().st_size / 2**20:.1f} MiB of OpenMetrics)")
        prom, acct = (
            Prometheus(url, timeout=120),
            Accounting(cfg.slurm_env() | {"PATH": cfg.env()["PATH"]}),
        )
        print("backtest, stage by stage (untraced):")
        report, n = _stages(prom, acct, h, measure=True)
        print(f"  ({n})")
        print("report:", json.dumps(report.counts()))
        # The same backtest again under tracemalloc (which slows what it traces: no times).
        tracemalloc.start()
        _stages(prom, acct, h, measure=False)
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(
            f"memory: the backtest's traced peak {traced_peak / 2**20:.0f} MiB; the bench's "
            f"peak RSS {peak_rss_mib():.0f} MiB (with the generated history)"
        )
        # The record read back through the Slurm commands and Prometheus' API against the
        # history as generated: what the real parts lose or change.
        truth = _truth(h)
        print("as generated:", json.dumps(truth.counts()))
    finally:
        manage.down(cfg, purge=True)
        processes.stop(cfg, "bench-prometheus")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
