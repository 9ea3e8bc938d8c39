"""A Slurm exporter for the lab, serving the metric names of SckyzO/slurm_exporter.

No Slurm exporter is packaged for Debian, so the lab serves the subset of that exporter's
metrics slurmedic's rules use, computed from the real lab cluster (through slurmedic's Slurm
adapter, on every release). Names and labels follow its docs/metrics.md: per-node status with the
partition, node counts per state and partition, drain reasons, GPU gres, jobs per state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector

from lab.config import LabConfig
from lab.serve import serve_forever
from lab.slurm_view import SlurmView
from webhook.adapters.slurm import SlurmNode

NODE_STATES = (
    "alloc",
    "comp",
    "down",
    "drain",
    "err",
    "fail",
    "idle",
    "inval",
    "maint",
    "mix",
    "resv",
    "other",
    "planned",
)
JOB_STATES = (
    "pending",
    "running",
    "suspended",
    "completing",
    "completed",
    "configuring",
    "failed",
    "timeout",
    "preempted",
    "node_fail",
    "cancelled",
)


def state_bucket(node: SlurmNode) -> str:
    """The slurm_nodes_<state> counter a node counts in (drain wins, as in the exporter)."""
    long = node.state_long.rstrip("*+")
    return {
        "allocated": "alloc",
        "mixed": "mix",
        "idle": "idle",
        "down": "down",
        "drained": "drain",
        "draining": "drain",
        "completing": "comp",
        "maint": "maint",
        "planned": "planned",
        "inval": "inval",
        "reserved": "resv",
        "fail": "fail",
        "failing": "fail",
        "error": "err",
    }.get(long, "other")


def gres_count(gres: str) -> int:
    """`gpu:8` or `gpu:h200:8(IDX:0-7)` to 8; anything else to 0."""
    total = 0
    for item in (gres or "").split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


class SlurmCollector(Collector):
    def __init__(self, view: SlurmView) -> None:
        self.view = view

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nodes, jobs = self.view.nodes(), self.view.jobs()
        labels = ["node", "status", "partition"]
        status = GaugeMetricFamily("slurm_node_status", "Node Status with partition", labels=labels)
        gres_l = [*labels, "gres_type"]
        g_total = GaugeMetricFamily(
            "slurm_node_gres_total", "Generic resources configured on the node", labels=gres_l
        )
        g_used = GaugeMetricFamily(
            "slurm_node_gres_used", "Generic resources allocated on the node", labels=gres_l
        )
        reason = GaugeMetricFamily(
            "slurm_node_drain_reason_info",
            "Always 1; the reason label carries the text",
            labels=["node", "reason"],
        )
        since = GaugeMetricFamily(
            "slurm_node_drain_since_timestamp_seconds",
            "Unix time at which the reason was set",
            labels=["node"],
        )
        per_state = {
            s: GaugeMetricFamily(
                f"slurm_nodes_{s}", f"{s} nodes", labels=["partition", "active_feature_set"]
            )
            for s in NODE_STATES
        }
        counts: Counter[tuple[str, str]] = Counter()
        partitions: set[str] = set()
        for n in nodes:
            st = n.state_long
            for p in n.partitions:
                partitions.add(p)
                status.add_metric([n.name, st, p], 1)
                g_total.add_metric([n.name, st, p, "gpu"], gres_count(n.gres))
                g_used.add_metric([n.name, st, p, "gpu"], gres_count(n.gres_used))
                counts[(p, state_bucket(n))] += 1
            if n.reason and ("DRAIN" in n.flags or st.startswith("down")):
                reason.add_metric([n.name, n.reason], 1)
                if n.reason_set_at is not None:
                    since.add_metric([n.name], n.reason_set_at.timestamp())
        for p in sorted(partitions):
            for s in NODE_STATES:
                per_state[s].add_metric([p, ""], counts[(p, s)])
        yield from (status, g_total, g_used, reason, since, *per_state.values())
        total = GaugeMetricFamily("slurm_nodes_total", "Total number of nodes")
        total.add_metric([], len(nodes))
        yield total

        by_state = Counter(j.state.lower() for j in jobs)
        for s in JOB_STATES:
            g = GaugeMetricFamily(f"slurm_jobs_{s}", f"Total {s} jobs")
            g.add_metric([], by_state[s])
            yield g
        up = GaugeMetricFamily(
            "slurm_exporter_collector_success", "1=OK, 0=FAIL per collector", labels=["collector"]
        )
        up.add_metric(["slurmctld"], 1 if self.view.ok else 0)
        yield up


def main() -> None:
    cfg = LabConfig.from_env()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SlurmCollector(SlurmView(cfg)))
    serve_forever({cfg.slurm_exporter_port: lambda: generate_latest(registry).decode()})


if __name__ == "__main__":
    main()
