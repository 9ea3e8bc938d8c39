"""The lab's Slurm cluster: 8 idle nodes, two partitions, two leaf switches, idempotent up;
and slurmedic's view of it (`cluster show`) on the lab's stack."""

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab import manage
from lab.config import LabConfig
from lab.monitoring import cluster_config
from lab.slurm import node_states, slurm
from tests.lab.conftest import eventually, running_nodes

pytestmark = pytest.mark.lab


def test_eight_idle_nodes(lab_cfg: LabConfig) -> None:
    idle = {f"gpu{i:02d}": "idle" for i in range(1, 9)}
    # A node an earlier test killed and brought back registers again within seconds.
    eventually(lambda: node_states(lab_cfg) == idle, what="eight idle nodes")


def test_partitions(lab_cfg: LabConfig) -> None:
    out = slurm(lab_cfg, "sinfo", "-h", "-o", "%P %D %N")
    assert sorted(out.split("\n")[:-1]) == ["debug 2 gpu[07-08]", "train* 6 gpu[01-06]"]


def test_every_node_has_eight_gpus(lab_cfg: LabConfig) -> None:
    out = slurm(lab_cfg, "sinfo", "-h", "-N", "-o", "%N %G")
    assert {line.split()[1] for line in out.splitlines()} == {"gpu:8"}


def test_topology_has_two_leaf_switches(lab_cfg: LabConfig) -> None:
    out = slurm(lab_cfg, "scontrol", "show", "topology")
    assert "SwitchName=leaf1 Level=0" in out and "Nodes=gpu[01-04]" in out
    assert "SwitchName=leaf2 Level=0" in out and "Nodes=gpu[05-08]" in out


def test_up_again_changes_nothing(lab_cfg: LabConfig) -> None:
    before = {d.name: d.pid for d in manage.status(lab_cfg)}
    assert all(before.values())
    manage.up(lab_cfg)
    assert {d.name: d.pid for d in manage.status(lab_cfg)} == before


def cluster_show(cfg: LabConfig, config: Path | None = None) -> dict[str, Any]:
    """`slurmedic cluster show --json` as an operator runs it: the lab's slurmedic config (or
    `config`), and no Slurm on PATH beyond the host's (the config's cluster.slurm_bin must get
    it right)."""
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "cluster", "show", "--json",
         f"--config={config or cfg.slurmedic_config}"],
        capture_output=True, text=True, timeout=60, check=True,
        env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"},
    )  # fmt: skip
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def rest_config(cfg: LabConfig, path: Path, **rest: Any) -> Path:
    """The lab's slurmedic config reading Slurm through slurmrestd only: no Slurm config or
    commands, the JWT the lab made at `up` (`scontrol token`, as a site's renewal job does)."""
    config = yaml.safe_load(cfg.slurmedic_config.read_text())
    config["cluster"] = cluster_config(cfg, "rest")
    config["cluster"]["rest"].update(rest)
    path.write_text(yaml.safe_dump(config))
    return path


def test_cluster_show_over_slurmrestd_is_what_the_commands_show(
    lab_cfg: LabConfig, submit: Callable[..., int], tmp_path: Path
) -> None:
    """The same view through the REST API (by the newest API version this release serves) as
    through scontrol/squeue/sinfo: nodes, switches, jobs and the release."""
    job = submit(nodes=2, exclude="gpu08")
    running_nodes(lab_cfg, job)
    rest = rest_config(lab_cfg, tmp_path / "rest.yml")
    # Read twice each way: a job's or node's state can move between two reads.
    pairs = [(cluster_show(lab_cfg), cluster_show(lab_cfg, rest)) for _ in range(3)]
    assert any(cli == over_rest for cli, over_rest in pairs), pairs[-1]
    cli = pairs[-1][0]
    assert {n["switch"] for n in cli["nodes"]} == {"leaf1", "leaf2"}
    assert job in {j["id"] for j in cli["jobs"]}


def test_a_slinky_pod_s_kubernetes_node_is_read_from_its_node_comment_both_ways(
    lab_cfg: LabConfig, tmp_path: Path
) -> None:
    """Slinky's operator writes each slurmd pod's place into its Slurm node's comment; the view
    reads the Kubernetes node from it on every release, through the commands and through
    slurmrestd alike (docs/slinky.md)."""
    info = {"namespace": "slurm", "podName": "gpu03", "node": "k8s-gpu-7", "nodeSetName": "gpu"}
    slurm(lab_cfg, "scontrol", "update", "nodename=gpu03", f"comment={json.dumps(info)}")
    try:
        rest = rest_config(lab_cfg, tmp_path / "rest.yml")
        for config in (None, rest):
            hosts = {n["name"]: n["host"] for n in cluster_show(lab_cfg, config)["nodes"]}
            assert hosts["gpu03"] == "k8s-gpu-7", (config, hosts)
            assert {h for n, h in hosts.items() if n != "gpu03"} == {""}, (config, hosts)
    finally:
        slurm(lab_cfg, "scontrol", "update", "nodename=gpu03", "comment=")


def test_slurmrestd_s_refusal_is_one_line_naming_the_url(
    lab_cfg: LabConfig, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jwt"
    bad.write_text("SLURM_JWT=not.a.token\n")
    config = rest_config(lab_cfg, tmp_path / "bad.yml", token_file=str(bad))
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "cluster", "show", f"--config={config}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode != 0
    error = out.stderr.strip().splitlines()
    assert len(error) == 1 and f"{lab_cfg.slurmrestd_url}/" in error[0], out.stderr
    # Each release refuses in its own words (22.05: 500 "Unspecified error", after serving
    # /openapi/v3 without a token): the status and what slurmrestd said, on one line.
    assert re.search(r": HTTP [45]\d\d: \S", error[0]), error


def test_cluster_show_is_what_slurm_says(
    lab_cfg: LabConfig, submit: Callable[..., int], clean_faults: None
) -> None:
    """On this stack's Slurm: the release, nodes (state, partitions, drain reason, switch) and
    jobs (state, expanded nodes, its owner's exclusions, restarts after a requeue, requeue flag,
    comment, times)."""
    comment = json.dumps({"slurmedic": {"max_requeues": 1}})
    job = submit(nodes=2, comment=comment, exclude="gpu0[5-6]")
    held = submit(nodes=1, partition="debug", requeue=False)
    nodes = running_nodes(lab_cfg, job)
    running_nodes(lab_cfg, held)
    slurm(lab_cfg, "scontrol", "requeue", str(job))  # restarts 1, and it runs again
    eventually(lambda: manage.running_job(lab_cfg, job)[1] == 1, timeout=60, what="requeued")
    nodes = running_nodes(lab_cfg, job)
    idle = sorted(n for n, s in node_states(lab_cfg).items() if s == "idle")[0]
    slurm(lab_cfg, "scontrol", "update", f"nodename={idle}", "state=drain", "reason=xid 79 gpu 3")
    try:
        view = cluster_show(lab_cfg)
    finally:
        slurm(lab_cfg, "scontrol", "update", f"nodename={idle}", "state=resume")
    release = slurm(lab_cfg, "scontrol", "--version").split()[-1]
    assert view["slurm_release"] == release
    by_name = {n["name"]: n for n in view["nodes"]}
    assert sorted(by_name) == [f"gpu{i:02d}" for i in range(1, 9)]
    assert by_name[idle] == {
        "name": idle,
        "state": "drain",
        "partitions": [lab_cfg.partition_of(idle)],
        "reason": "xid 79 gpu 3",
        "switch": "leaf1" if idle <= "gpu04" else "leaf2",
        "host": "",
    }
    assert {by_name[n]["state"] for n in nodes} == {"allocated"}
    jobs = {j["id"]: j for j in view["jobs"]}
    mine = jobs[job]
    assert mine["state"] == "RUNNING" and mine["nodes"] == nodes
    assert mine["excluded"] == ["gpu05", "gpu06"] and not {"gpu05", "gpu06"} & set(nodes)
    assert jobs[held]["excluded"] == []
    assert (mine["restarts"], mine["requeue"], mine["comment"]) == (1, True, comment)
    assert mine["partition"] == "train" and mine["user"] == "root" and mine["ended"] is None
    assert datetime.fromisoformat(mine["started"]).tzinfo is not None
    assert (jobs[held]["requeue"], jobs[held]["partition"]) == (False, "debug")
    slurm(lab_cfg, "scancel", str(held))
    eventually(
        lambda: {j["id"]: j for j in cluster_show(lab_cfg)["jobs"]}[held]["state"] == "CANCELLED",
        what="the cancelled job in the view",
    )
    ended = {j["id"]: j for j in cluster_show(lab_cfg)["jobs"]}[held]
    assert ended["state"] == "CANCELLED" and ended["ended"] is not None
    assert ended["exit_code"] is None  # a signal ended it: no exit code
    assert mine["exit_code"] is None  # still running


def test_a_job_s_exit_code_is_read_on_every_release(lab_cfg: LabConfig, tmp_path: Path) -> None:
    """The exit code a job ended with (NVRx's 93: "do not restart me"): 22.05 prints the raw
    wait status (93 << 8), later releases the code itself. On gpu08: a job that failed is news
    to a node's alert within `node_alert_lag` (the next tests' faults are on other nodes;
    test_decisions' idle gpu07 among them)."""
    out = slurm(lab_cfg, "sbatch", "--parsable", "--partition=debug", "--nodelist=gpu08",
                "--requeue", f"--output={tmp_path / 'job.out'}", "--wrap", "exit 93")  # fmt: skip
    job = int(out.strip().split(";")[0])

    def ended() -> dict[str, Any] | None:
        found = {j["id"]: j for j in cluster_show(lab_cfg)["jobs"]}.get(job)
        return found if found is not None and found["state"] == "FAILED" else None

    assert eventually(ended, timeout=60, what=f"job {job} failed")["exit_code"] == 93
