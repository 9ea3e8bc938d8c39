"""Host names as alerts spell them: the policy's `node_names` maps them to Slurm's, and a host
that still names no node is never acted on, and never dropped in silence."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from webhook.cli import main
from webhook.core.alerts import Alert, wrap
from webhook.core.cluster import ClusterView, Node
from webhook.core.engine import Engine
from webhook.core.node_names import NodeNames, Rewrite
from webhook.core.policy import PolicyError, load_policy
from webhook.replay import replay_json

NODES = {"gpu003", "gpu012", "login.a"}
MAPPED = (
    Path(__file__).resolve().parents[1]
    / "scenarios"
    / ("decide-fqdn-host-names-mapped-by-strip-domain.yaml")
)


def test_a_node_s_own_name_is_always_that_node() -> None:
    names = NodeNames(strip_domain=True)
    assert names.resolve("gpu003", NODES) == "gpu003"
    # A Slurm name with a dot stays itself: the mapping applies only to names Slurm lacks.
    assert names.resolve("login.a", NODES) == "login.a"


def test_strip_domain_maps_fully_qualified_names_but_never_an_address() -> None:
    names = NodeNames(strip_domain=True)
    assert names.resolve("gpu003.cluster.example.org", NODES) == "gpu003"
    assert names.resolve("10.0.0.3", {"10"}) is None
    assert NodeNames().resolve("gpu003.cluster.example.org", NODES) is None


def test_rewrites_apply_in_order_after_the_domain_is_stripped() -> None:
    names = NodeNames(
        strip_domain=True,
        rewrite=[
            Rewrite(match=r"(?P<n>gpu[0-9]+)-bmc", replace=r"\g<n>"),
            Rewrite(match=r"gpu-(\d+)", replace=r"gpu0\1"),
        ],
    )
    assert names.resolve("gpu012-bmc.mgmt.example.org", NODES) == "gpu012"
    assert names.resolve("gpu-12", NODES) == "gpu012"
    assert names.resolve("cpu-12", NODES) is None


def test_the_hint_says_what_would_match() -> None:
    assert NodeNames().hint("gpu003.cluster.example.org", NODES) == (
        "its short name gpu003 is a node: set node_names.strip_domain"
    )
    assert NodeNames().hint("gpu999.cluster.example.org", NODES) == ""
    assert NodeNames(strip_domain=True).hint("gpu003.x", NODES) == ""


@pytest.mark.parametrize(
    ("rewrite", "error"),
    [
        ({"match": "(gpu", "replace": "x"}, "node_names.rewrite.0.match: "),
        ({"match": "(gpu)", "replace": r"\2"}, "names group '2', which match does not have"),
        ({"match": "gpu", "replace": r"\g<n>"}, "names group 'n', which match does not have"),
        ({"match": "gpu", "replace": "x", "swap": 1}, "node_names.rewrite.0.swap"),
    ],
)
def test_a_bad_rewrite_is_refused_naming_its_key(rewrite: dict[str, object], error: str) -> None:
    with pytest.raises(PolicyError, match="node_names") as e:
        load_policy({"node_names": {"rewrite": [rewrite]}})
    assert error in str(e.value)


def _engine(names: dict[str, object]) -> Engine:
    view = ClusterView(nodes={n: Node(n, "train", "idle") for n in ("gpu003", "gpu004")})
    return Engine(view=view, policy=load_policy({"node_names": names}))


def _xid(host: str, label: str = "hostname") -> Alert:
    return Alert(
        status="firing",
        labels={"alertname": "GpuFellOffBus", "signal": "gpu_hw", label: host, "gpu": "1"},
        startsAt=datetime(2026, 11, 29, 12, tzinfo=UTC),
    )


def test_the_engine_tallies_alerts_naming_no_node_and_acts_on_mapped_ones() -> None:
    at = datetime(2026, 11, 29, 12, 0, 5, tzinfo=UTC)
    blind = _engine({})
    got = blind.receive(
        wrap([_xid("gpu003.example.org"), _xid("gpu003.example.org:9400", "instance")]), at
    )
    # The second is the same host once its port is gone: one host, two alerts.
    assert got.unmatched == ("gpu003.example.org",) and got.new == 2 and not got.incidents
    (seen,) = blind.take_unmatched()
    assert (seen.host, seen.alerts, seen.alertname) == ("gpu003.example.org", 2, "GpuFellOffBus")
    assert seen.hint == "its short name gpu003 is a node: set node_names.strip_domain"
    assert blind.take_unmatched() == []  # taken once

    mapped = _engine({"strip_domain": True})
    got = mapped.receive(wrap([_xid("gpu003.example.org")]), at)
    assert got.unmatched == () and got.incidents == ("node:gpu003",)
    assert mapped.take_unmatched() == []


def test_replay_lists_the_unmatched_hosts_and_says_so_on_stderr(tmp_path: Path) -> None:
    data = yaml.safe_load(MAPPED.read_text())
    del data["policy"]
    path = tmp_path / "blind.yaml"
    path.write_text(yaml.safe_dump(data))
    out = CliRunner().invoke(main, ["replay", str(path), "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    # Only the alert that named Slurm's own name (the NCCL timeout on gpu001) reached an
    # incident, and it is no decision alone within the scenario's five minutes.
    assert [d["action"] for d in result["decisions"]] != ["drain", "requeue", "drain"]
    assert result["unmatched"] == [
        {
            "host": "gpu003.cluster.example.org",
            "alerts": 1,
            "alertname": "GpuFellOffBus",
            "hint": "its short name gpu003 is a node: set node_names.strip_domain",
        },
        {
            "host": "gpu012-bmc.cluster.example.org",
            "alerts": 1,
            "alertname": "GpuFellOffBus",
            "hint": "",
        },
    ]
    assert (
        "1 alert(s) named gpu003.cluster.example.org, which is no node of the cluster: not acted "
        "on (its short name gpu003 is a node: set node_names.strip_domain)"
    ) in out.stderr
    # With the mapping, nothing is left unmatched (and the key is absent: the contract's
    # output is unchanged for scenarios that name Slurm's nodes).
    assert "unmatched" not in replay_json(MAPPED)


def test_a_misspelled_scenario_key_is_an_error_and_a_date_needs_its_zone(tmp_path: Path) -> None:
    data = yaml.safe_load(MAPPED.read_text())
    data["cluster"]["swtiches"] = data["cluster"].pop("nodes")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    out = CliRunner().invoke(main, ["replay", str(path), "--json"])
    assert out.exit_code == 2
    assert "typo.yaml: cluster.swtiches: unknown key" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1

    data = yaml.safe_load(MAPPED.read_text())
    data["start"] = "2026-11-29 12:00:00"
    path.write_text(yaml.safe_dump(data))
    out = CliRunner().invoke(main, ["replay", str(path), "--json"])
    assert out.exit_code == 2 and "start: " in out.stderr and "timezone" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1

    data = yaml.safe_load(MAPPED.read_text())
    data["notes"] = "a key of the site's own"
    path.write_text(yaml.safe_dump(data))
    out = CliRunner().invoke(main, ["replay", str(path), "--json"])
    assert out.exit_code == 0
    assert f"{path}: notes: not a key of the format" in out.stderr


def test_check_hosts_says_how_many_match_and_what_would() -> None:
    from webhook.core.node_names import check_hosts

    nodes = {f"gpu{i:03d}" for i in range(1, 2049)}
    fqdn = [f"gpu{i:03d}.cluster.example.org" for i in range(1, 413)]
    found = check_hosts([*sorted(nodes)[412:], *fqdn], nodes, NodeNames())
    assert found.hosts == 2048 and len(found.unmatched) == 412
    assert found.summary() == (
        "412 of 2,048 hosts match no Slurm node (gpu001.cluster.example.org, "
        "gpu002.cluster.example.org, gpu003.cluster.example.org, ... (409 more)): they look like "
        "fully qualified names: set node_names.strip_domain in the policy"
    )
    assert check_hosts(fqdn, nodes, NodeNames(strip_domain=True)).summary() == (
        "all 412 hosts are nodes of the cluster"
    )
    other = check_hosts(["node-a", "node-b"], nodes, NodeNames())
    assert other.hint.startswith("map them with node_names in the policy")
