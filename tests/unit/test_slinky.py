"""Slurm on Kubernetes (SchedMD's Slinky slurm-operator): each Slurm node is a slurmd pod whose
Kubernetes node the operator writes into the Slurm node's comment; an alert naming that
Kubernetes node is about the pod's Slurm node, and the operator's own drains stay its own."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from webhook.adapters.slinky import OPERATOR_REASON, pod_host
from webhook.adapters.slurm import Release, SlurmSnapshot, read_nodes
from webhook.core.alerts import Alert, wrap
from webhook.core.cluster import ClusterView, Node
from webhook.core.engine import Engine
from webhook.core.incidents import REASON
from webhook.core.node_names import NodeNames, check_hosts
from webhook.core.policy import load_policy

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"


def pod_info(pod: str, host: str, **more: str) -> str:
    """The comment Slinky's operator writes on a NodeSet pod's Slurm node."""
    return json.dumps(
        {"namespace": "slurm", "podName": pod, "node": host, "nodeSetName": "gpu", **more}
    )


@pytest.mark.parametrize(
    ("comment", "host"),
    [
        (pod_info("gpu-0", "k8s-a100-17"), "k8s-a100-17"),
        (pod_info("gpu-0", ""), ""),  # the pod is not scheduled yet
        ("", ""),
        ("checked 2026-12-01", ""),  # a person's comment
        ('{"podName": "gpu-0"', ""),  # cut short
        ('{"node": "k8s-a100-17"}', ""),  # not the operator's: no pod
        ('{"podName": "gpu-0", "node": 17}', ""),
        ('["gpu-0"]', ""),
    ],
)
def test_the_kubernetes_node_is_read_only_from_the_operator_s_comment(
    comment: str, host: str
) -> None:
    assert pod_host(comment) == host


def test_every_release_s_node_json_carries_the_comment_into_the_view() -> None:
    for release_dir in sorted(p for p in DATA.iterdir() if p.is_dir()):
        release = Release.parse((release_dir / "version.txt").read_text())
        name = "nodes.json" if release.scontrol_json else "sinfo.json"
        data = json.loads((release_dir / name).read_text())
        for i, node in enumerate(data["nodes"]):
            node["comment"] = pod_info(f"gpu-{i}", f"k8s-{i}")
        nodes = read_nodes(data, release, ("scontrol",))
        assert [n.host for n in nodes] == [f"k8s-{i}" for i in range(len(nodes))], release
        view = SlurmSnapshot(release, nodes).view()
        assert view.hosts == {f"k8s-{i}": n.name for i, n in enumerate(nodes)}, release


def slinky_view() -> ClusterView:
    nodes = {
        "gpu-0": Node("gpu-0", "train", "idle", host="k8s-a100-17"),
        "gpu-1": Node("gpu-1", "train", "idle", host="k8s-a100-18"),
        # Two slurmd pods on one Kubernetes node: an alert about its GPUs names neither.
        "cpu-0": Node("cpu-0", "cpu", "idle", host="k8s-cpu-1"),
        "cpu-1": Node("cpu-1", "cpu", "idle", host="k8s-cpu-1"),
        # A node that runs on a machine of its own name (DaemonSet mode, or no Kubernetes).
        "gpu17": Node("gpu17", "train", "idle", host="gpu17"),
    }
    return ClusterView(nodes=nodes)


def test_a_machine_names_the_one_node_on_it_and_a_node_s_own_name_wins() -> None:
    view = slinky_view()
    assert view.hosts == {"k8s-a100-17": "gpu-0", "k8s-a100-18": "gpu-1"}
    names = NodeNames(strip_domain=True)
    assert names.resolve("k8s-a100-17", view.nodes, view.hosts) == "gpu-0"
    assert names.resolve("k8s-a100-17.cluster.local", view.nodes, view.hosts) == "gpu-0"
    assert names.resolve("gpu-1", view.nodes, view.hosts) == "gpu-1"
    assert names.resolve("gpu17", view.nodes, view.hosts) == "gpu17"
    assert names.resolve("k8s-cpu-1", view.nodes, view.hosts) is None
    assert NodeNames().resolve("k8s-a100-17.cluster.local", view.nodes, view.hosts) is None
    found = check_hosts(["k8s-a100-17", "k8s-cpu-1"], view.nodes, NodeNames(), view.hosts)
    assert found.unmatched == ("k8s-cpu-1",)


def test_an_alert_from_a_kubernetes_node_opens_the_incident_of_its_pod_s_slurm_node() -> None:
    engine = Engine(view=slinky_view(), policy=load_policy({}))
    alert = Alert(
        status="firing",
        labels={
            "alertname": "GpuFellOffBus",
            "signal": "gpu_hw",
            "Hostname": "k8s-a100-18",
            "gpu": "3",
        },
        startsAt=datetime(2026, 12, 7, 12, tzinfo=UTC),
    )
    got = engine.receive(wrap([alert]), datetime(2026, 12, 7, 12, 0, 5, tzinfo=UTC))
    assert got.unmatched == () and got.incidents == ("node:gpu-1",)


def test_slurmedic_s_drain_reason_is_never_the_operator_s() -> None:
    # The operator clears drains whose reason begins with its prefix when the Kubernetes node is
    # uncordoned; any other reason is an external drain it keeps.
    assert not REASON.startswith(OPERATOR_REASON)
    assert not OPERATOR_REASON.startswith(REASON.strip())


def test_doctor_says_the_nodes_are_slinky_pods_and_that_slurm_reboots_none(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from webhook.cli import main

    src = DATA / "26.05.5"
    data = json.loads((src / "nodes.json").read_text())
    for i, node in enumerate(data["nodes"]):
        node["comment"] = pod_info(node["name"], f"k8s-{i // 2}")  # two pods a machine
    data["nodes"][0]["reason"] = f"{OPERATOR_REASON} GPU ECC error detected"
    (tmp_path / "nodes.json").write_text(json.dumps(data))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    answers = {
        "--version": src / "version.txt",
        "show nodes --json": tmp_path / "nodes.json",
        "show jobs --json": src / "jobs.json",
        "show topology": src / "topology.txt",
    }
    cases = "\n".join(f'  "{argv}") exec cat {path} ;;' for argv, path in answers.items())
    script = bindir / "scontrol"
    script.write_text(f'#!/bin/sh\ncase "$*" in\n{cases}\n  *) exit 1 ;;\nesac\n')
    script.chmod(0o755)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    config = tmp_path / "config.yml"
    config.write_text(
        f"database_url: sqlite:///{tmp_path}/ledger.db\nauth: {{bearer_token_file: {token}}}\n"
        f"cluster: {{slurm_bin: {bindir}}}\n"
    )
    out = CliRunner().invoke(main, ["doctor", f"--config={config}", "--json"])
    found = {f["check"]: f for f in json.loads(out.stdout) if f["check"].startswith("slinky")}
    assert found["slinky"]["status"] == "warn", found
    assert found["slinky"]["detail"].startswith("8 of 8 nodes are Slinky's slurmd pods on 4 ")
    assert "4 Kubernetes node(s) run several" in found["slinky"]["detail"]
    assert found["slinky drains"]["detail"].startswith("1 node(s) drained by the operator")
    reboots = [f for f in json.loads(out.stdout) if f["check"] == "slurm reboots"]
    assert any("not Slurm's RebootProgram" in f["detail"] for f in reboots), reboots
