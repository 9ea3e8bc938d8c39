"""The rules split as docs/rule-scale.md lays them out when one Prometheus is not enough.

A Prometheus per leaf switch scrapes its nodes' dcgm-exporters and evaluates their per-node
rules (profile `shard`); the lab's Prometheus becomes the global ruler (profile `global`): no
node exporters, the shards' per-job GPU counts federated, the training, goodput, Slurm and
self-monitoring rules. Everything reaches the lab's Alertmanager as before.
"""

import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import hostlist
import pytest
import requests

from lab import api, manage, monitoring, processes
from lab.config import LabConfig
from tests.lab.conftest import Receiver, eventually, query, running_nodes
from webhook.rules.render import JOB_GPUS_RECORD

pytestmark = pytest.mark.lab


@pytest.fixture
def split_lab(lab_cfg: LabConfig) -> Iterator[dict[str, list[str]]]:
    """The lab split into shards for one test, one Prometheus again after it; each shard's
    name to its nodes."""
    monitoring.split(lab_cfg)
    try:
        yield {s.name: hostlist.expand_hostlist(s.nodes) for s in lab_cfg.switches}
    finally:
        monitoring.join(lab_cfg)


def test_per_node_rules_on_the_shards_cross_node_rules_on_the_global_ruler(
    lab_cfg: LabConfig,
    receiver: Receiver,
    submit: Callable[..., int],
    clean_faults: None,
    split_lab: dict[str, list[str]],
) -> None:
    split_at = time.time()
    leaf_of = {node: shard for shard, nodes in split_lab.items() for node in nodes}
    # Three nodes of gpu[03-06]: ranks on both leaf switches, whichever Slurm picks.
    job = submit(nodes=3, exclude="gpu[01-02]")
    nodes = running_nodes(lab_cfg, job)
    assert {leaf_of[n] for n in nodes} == set(split_lab), nodes

    # The ruler knows the job holds its GPUs only from the two shards' counts.
    def running() -> float:
        found = query(lab_cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}')
        return float(found[0]["value"]) if found else 0.0

    gpus = lab_cfg.gpus_per_node
    eventually(lambda: running() == gpus * len(nodes), timeout=40, what="the job's GPUs added up")
    for shard, mine in split_lab.items():
        url = lab_cfg.url(lab_cfg.prometheus_shard_port(shard))
        counted = api.query(lab_cfg, f'{JOB_GPUS_RECORD}{{slurm_job_id="{job}"}}', url)
        assert [c["value"] for c in counted] == [gpus * len(set(nodes) & set(mine))], shard
    targets = requests.get(f"{lab_cfg.prometheus_url}/api/v1/targets", timeout=5).json()
    jobs = {t["labels"]["job"] for t in targets["data"]["activeTargets"]}
    assert "dcgm" not in jobs and monitoring.SHARD_JOB in jobs

    # A GPU fault on a node of the second leaf: its shard raises the alert, with the job.
    since = time.time()
    far = next(n for n in nodes if leaf_of[n] == lab_cfg.switches[1].name)
    manage.inject_gpu(lab_cfg, "xid", far, 3, xid=79)
    alert = eventually(
        lambda: receiver.alerts(
            "GpuXidNodeFault", since=since, node=far, gpu="3", slurm_job_id=str(job)
        ),
        timeout=40,
        what="GpuXidNodeFault from the second shard",
    )[0]
    assert alert["labels"]["shard"] == leaf_of[far]
    assert urlsplit(alert["generatorURL"]).port == lab_cfg.prometheus_shard_port(leaf_of[far])

    # A rank on the first leaf hangs: the ruler raises TrainingHang (no shard evaluates it).
    rank = next(r for r, n in enumerate(nodes) if leaf_of[n] == lab_cfg.switches[0].name)
    manage.inject_job(lab_cfg, "hang", job, rank)
    hang = eventually(
        lambda: receiver.alerts("TrainingHang", since=since, slurm_job_id=str(job), rank=str(rank)),
        timeout=60,
        what="TrainingHang from the global ruler",
    )[0]
    assert hang["labels"]["node"] == nodes[rank] and "shard" not in hang["labels"]
    assert urlsplit(hang["generatorURL"]).port == lab_cfg.prometheus_port

    # The ruler says when it loses a shard, and not before.
    down = lab_cfg.switches[1].name

    def shard_down() -> list[dict[str, Any]]:
        return receiver.alerts("SlurmedicShardDown", since=split_at, path="/oncall")

    assert not shard_down()
    processes.stop(lab_cfg, monitoring.shard_name(down))
    port = lab_cfg.prometheus_shard_port(down)
    told = eventually(shard_down, timeout=40, what="SlurmedicShardDown at the oncall receiver")
    assert {a["labels"]["instance"] for a in told} == {f"127.0.0.1:{port}"}
