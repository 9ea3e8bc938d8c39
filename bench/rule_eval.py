"""Rule evaluation cost at scale: slurmedic's production rules over 2,048 nodes x 8 GPUs.

A real Prometheus scrapes synthetic exporters built from the lab's own fake dcgm-exporter
values (16 targets of 128 nodes, each GPU with every DCGM series the rules read), a Slurm
exporter view of the 2,048 nodes, 256 training jobs of 8 ranks pushing progress, and mtail-style
log counters. It evaluates the rendered production rules (alert_rules/*.rules.yml) every
`--interval` and the bench prints what Prometheus itself reports:
`prometheus_rule_group_last_duration_seconds` per group, the head series count and RSS.

    .venv/bin/python -m bench.rule_eval [--nodes 2048] [--seconds 120] [--interval 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
import yaml

from lab.config import LabConfig
from lab.dcgm_exporter import COUNTERS, GAUGES, NodeExporter, _labels, gpu_values
from lab.faults import GpuFault
from webhook.rules.render import RULES_DIR

PORT_BASE = 28000  # below the ephemeral range, clear of the labs (17000, 27000, 30000, 31000)
NODES_PER_TARGET = 128


class _NoJobView:
    def __init__(self, job_of: dict[str, int]) -> None:
        self.job_of = job_of

    def job_on(self, node: str) -> int | None:
        return self.job_of.get(node)


def dcgm_target(nodes: list[str], job_of: dict[str, int], now: float) -> str:
    """One exporter page holding many nodes (families merged, as a federating proxy would)."""
    cfg = LabConfig(run_dir=Path(tempfile.gettempdir()))
    rows: dict[str, list[str]] = defaultdict(list)
    view = _NoJobView(job_of)
    for i, node in enumerate(nodes):
        exp = NodeExporter(cfg, node, view)  # type: ignore[arg-type]
        job = job_of.get(node)
        # A few realistic faults so that some alerts really fire.
        faults = [GpuFault(node=node, gpu=0, kind="xid", xid=79, at=now)] if i % 97 == 5 else []
        for gpu in range(8):
            labels = _labels(exp.gpu_labels(gpu, job))
            for name, value in gpu_values(job is not None, faults if gpu == 0 else [], now).items():
                rows[name].append(f"{name}{{{labels}}} {value:g}")
    out = []
    for name, lines in rows.items():
        kind = "counter" if name in COUNTERS else "gauge"
        out += [f"# HELP {name} {({**GAUGES, **COUNTERS})[name]}", f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n"


def slurm_target(nodes: list[str], job_of: dict[str, int]) -> str:
    out = ["# TYPE slurm_node_status gauge"]
    for n in nodes:
        status = "allocated" if n in job_of else "idle"
        out.append(f'slurm_node_status{{node="{n}",status="{status}",partition="train"}} 1')
    out += ["# TYPE slurm_jobs_node_fail gauge", "slurm_jobs_node_fail 0"]
    return "\n".join(out) + "\n"


def training_target(job_of: dict[str, int], now: float) -> str:
    out = []
    for metric in (
        "training_step",
        "training_step_seconds",
        "training_last_step_timestamp_seconds",
    ):
        out.append(f"# TYPE {metric} gauge")
        ranks: dict[int, int] = defaultdict(int)
        for node, job in sorted(job_of.items()):
            rank = ranks[job]
            ranks[job] += 1
            value = {
                "training_step": 1000,
                "training_step_seconds": 1.0 + 0.01 * rank,
                "training_last_step_timestamp_seconds": now,
            }[metric]
            out.append(
                f'{metric}{{job="training",instance="",slurm_job_id="{job}",'
                f'rank="{rank}",node="{node}"}} {value}'
            )
    out.append("# TYPE training_log_nccl_timeouts_total counter")
    for job in sorted(set(job_of.values()))[:8]:
        out.append(f'training_log_nccl_timeouts_total{{slurm_job_id="{job}",node="x",rank="0"}} 1')
    return "\n".join(out) + "\n"


def serve(port: int, render: object) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render().encode()  # type: ignore[operator]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--jobs", type=int, default=256)
    p.add_argument("--seconds", type=int, default=120)
    p.add_argument("--interval", type=int, default=10)
    p.add_argument(
        "--rules",
        type=Path,
        default=RULES_DIR,
        help="directory of *.rules.yml to evaluate (e.g. an older rendering, to compare)",
    )
    args = p.parse_args()

    nodes = [f"gpu{i:05d}" for i in range(1, args.nodes + 1)]
    per_job = max(1, args.nodes // args.jobs)
    job_of = {n: 1000 + i // per_job for i, n in enumerate(nodes) if i // per_job < args.jobs}
    t0 = time.time()
    # Exporter pages are rendered once (values constant): the cost measured is Prometheus'.
    targets = [nodes[i : i + NODES_PER_TARGET] for i in range(0, len(nodes), NODES_PER_TARGET)]
    pages = {PORT_BASE + 100 + i: dcgm_target(t, job_of, t0) for i, t in enumerate(targets)}
    pages[PORT_BASE + 1] = slurm_target(nodes, job_of)
    servers = [serve(port, lambda text=text: text) for port, text in pages.items()]
    servers.append(serve(PORT_BASE + 2, lambda: training_target(job_of, time.time())))
    print(
        f"exporters ready: {len(pages) + 1} targets, "
        f"{sum(t.count(chr(10)) for t in pages.values()):,} lines, built in {time.time() - t0:.1f}s"
    )

    work = Path(tempfile.mkdtemp(prefix="slurmedic-bench-"))
    interval = f"{args.interval}s"
    (work / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {
                    "scrape_interval": interval,
                    "evaluation_interval": interval,
                    "scrape_timeout": interval,
                },
                "rule_files": [str(args.rules.resolve() / "*.rules.yml")],
                "scrape_configs": [
                    {
                        "job_name": "dcgm",
                        "static_configs": [
                            {"targets": [f"127.0.0.1:{p}" for p in pages if p >= PORT_BASE + 100]}
                        ],
                    },
                    {
                        "job_name": "slurm",
                        "static_configs": [{"targets": [f"127.0.0.1:{PORT_BASE + 1}"]}],
                    },
                    {
                        "job_name": "pushgateway",
                        "honor_labels": True,
                        "static_configs": [{"targets": [f"127.0.0.1:{PORT_BASE + 2}"]}],
                    },
                ],
            }
        )
    )
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{PORT_BASE + 90}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{PORT_BASE + 90}"
    try:
        durations: dict[str, list[float]] = defaultdict(list)
        deadline = time.time() + args.seconds
        while time.time() < deadline:
            time.sleep(args.interval)
            try:
                text = requests.get(f"{url}/metrics", timeout=5).text
            except requests.RequestException:
                continue
            for line in text.splitlines():
                if line.startswith("prometheus_rule_group_last_duration_seconds{"):
                    group = line.split('rule_group="')[1].split('"')[0].split(";")[-1]
                    durations[group].append(float(line.rsplit(" ", 1)[1]))
        own = requests.get(f"{url}/metrics", timeout=5).text
        series = next(
            float(ln.split()[1])
            for ln in own.splitlines()
            if ln.startswith("prometheus_tsdb_head_series ")
        )
        firing = requests.get(
            f"{url}/api/v1/query", params={"query": "count by (alertname) (ALERTS)"}, timeout=5
        ).json()["data"]["result"]
        rss_kb = int(
            next(
                ln
                for ln in Path(f"/proc/{prom.pid}/status").read_text().splitlines()
                if ln.startswith("VmRSS")
            ).split()[1]
        )
        print(
            f"\n{args.nodes} nodes x 8 GPUs, {len(set(job_of.values()))} jobs; "
            f"head series {int(series):,}; Prometheus RSS {rss_kb / 1024:.0f} MiB; "
            f"evaluation every {interval} for {args.seconds}s"
        )
        print(f"{'rule group':28} {'median ms':>10} {'max ms':>9} {'samples':>8}")
        total = 0.0
        for group, values in sorted(durations.items()):
            nonzero = [v for v in values if v > 0] or [0.0]
            med = statistics.median(nonzero)
            total += med
            print(f"{group:28} {med * 1000:10.1f} {max(nonzero) * 1000:9.1f} {len(values):8}")
        print(f"{'all groups':28} {total * 1000:10.1f}")
        groups = requests.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        rules = sorted(
            ((r["evaluationTime"], r["name"]) for g in groups for r in g["rules"]), reverse=True
        )
        top = ", ".join(f"{name} {t * 1000:.0f}" for t, name in rules[:6])
        print(f"most expensive rules (last evaluation, ms): {top}")
        print(
            "alerts firing: "
            + ", ".join(f"{r['metric']['alertname']}={r['value'][1]}" for r in firing)
        )
    finally:
        prom.terminate()
        prom.wait(10)
        for s in servers:
            s.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
