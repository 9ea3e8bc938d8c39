"""The repairs of drained nodes where people read them: `slurmedic nodes`, `slurmedic repairs`,
the console's nodes page and /metrics, from one real SQLite ledger whose repairs were moved by
the real core (webhook/core/repairs.py) and saved through the ledger's own API: a node in
repair, one back in service on probation, one waiting for a person to replace it, and an older
one sent for replacement that Slurm shows back in service."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import console_config
from tests.service.test_console import login, users
from webhook.app import create_app
from webhook.cli import main
from webhook.core import repairs
from webhook.core.cluster import Node
from webhook.core.decisions import Decision
from webhook.core.policy import load_policy
from webhook.core.repairs import Drained
from webhook.ledger.settings import Modes, Nodes, NodeSeen
from webhook.ledger.store import Ledger
from webhook.service.config import ServiceConfig

NOW = datetime.now(UTC).replace(microsecond=0)
POLICY = load_policy({"mode": "enforce"})
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass
class Site:
    ledger: Ledger
    config_path: Path
    config: ServiceConfig


def drain(
    ledger: Ledger, node: str, at: datetime, alert: str, state: str = "executed", seq: str = ""
) -> int:
    (i,) = ledger.record(
        [
            Decision(
                at=at,
                incident=f"node:{node}{seq}",
                job=None,
                action="drain",
                cause="gpu_hardware",
                reason=f"{alert} on {node}",
                nodes=(node,),
                mode="enforce" if state == "executed" else "monitor",
                state=state,
                partition="train",
            )
        ]
    )
    return i


def begin(ledger: Ledger, node: str, at: datetime, alert: str) -> None:
    d = Drained(node, drain(ledger, node, at, alert), f"node:{node}", "gpu_hardware", at, True,
                ((alert, None),), "train")  # fmt: skip
    repair, move = repairs.begin(d, 1, [], POLICY, at + timedelta(minutes=1))
    ledger.save_repair(repair, move, at + timedelta(minutes=1))


def step(ledger: Ledger, node: str, at: datetime) -> int | None:
    """The node's repair moved on by the core, on the cluster as Slurm shows it (drained by
    slurmedic; back from its reboot down, with the reboot's reason); the id of the step it
    decided, if any."""
    repair = ledger.repairs.of_node(node, EPOCH)[-1]
    seen = Node(node, "train", "drain", f"slurmedic: node:{node} gpu_hardware", status="drained")
    if (reboot := repair.last("reboot")) is not None and reboot.state == "executed":
        back = f"slurmedic: {repair.key} reboot : reboot issued : reboot complete"
        seen = Node(node, "train", "down", back, status="down")
    move = repairs.advance(repair, seen, POLICY, at, 0)
    assert move is not None, repair
    ids = ledger.save_repair(repair, move, at)
    return ids[0] if ids else None


def run(ledger: Ledger, decision: int | None, at: datetime, **detail: object) -> None:
    """A step's playbook ran (as the executor records it)."""
    assert decision is not None
    ledger.add_event(decision, "running", {"by": "executor"}, at)
    ledger.add_event(decision, "executed", {"by": "executor", **detail}, at)


def health(node: str, rc: int, output: str) -> dict[str, object]:
    """A health check's run as the executor records it: each node's exit status and output."""
    run = {"playbook": "health_check", "status": "successful"}
    return {"run": {**run, "health": {node: rc}, "health_output": {node: output}}}


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Made once, with the real command (hashing is slow on purpose)."""
    return users(tmp_path_factory.mktemp("users") / "users.yml")


@pytest.fixture
def site(tmp_path: Path, users_file: Path) -> Site:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(db)
    ledger.put(Modes(repeats_window_seconds=7 * 86400, repeats_count=2), NOW)
    m = timedelta(minutes=1)

    # Begun in this order (the ledger lists the newest first by when each began).
    # gpu14: sent for replacement 10 days ago (a failed row remap), replaced since: in service.
    begin(ledger, "gpu14", NOW - timedelta(days=10), "GpuRowRemapFailure")

    # gpu11, the lemon: drained twice; its repair (begun 9 days ago: under way at any age) is
    # rebooting it now.
    drain(ledger, "gpu11", NOW - timedelta(days=12), "GpuMissing", "recorded", ":0")
    t = NOW - timedelta(days=9)
    begin(ledger, "gpu11", t, "GpuMissing")
    reboot = step(ledger, "gpu11", NOW - 30 * m)
    assert reboot is not None
    ledger.add_event(reboot, "running", {"by": "executor"}, NOW - 29 * m)

    # gpu13: rebooted, its health check failed: waiting for a person to replace it.
    t = NOW - timedelta(hours=8)
    begin(ledger, "gpu13", t, "GpuMissing")
    run(ledger, step(ledger, "gpu13", t + 5 * m), t + 10 * m, run={"playbook": "reboot_nodes"})
    check = step(ledger, "gpu13", t + 15 * m)
    run(ledger, check, t + 30 * m, **health("gpu13", 1, "diag\nGPU 3 memory: FAIL"))
    assert step(ledger, "gpu13", t + 31 * m) is not None  # the escalation for replacement

    # gpu12: rebooted, checked, resumed 40 minutes after its drain: on probation.
    t = NOW - timedelta(hours=5)
    begin(ledger, "gpu12", t, "GpuMissing")
    run(ledger, step(ledger, "gpu12", t + 5 * m), t + 10 * m, run={"playbook": "reboot_nodes"})
    run(ledger, step(ledger, "gpu12", t + 15 * m), t + 30 * m, **health("gpu12", 0, "PASS"))
    run(ledger, step(ledger, "gpu12", t + 31 * m), t + 40 * m, run={"playbook": "resume_nodes"})
    step(ledger, "gpu12", t + 41 * m)

    statuses = {"gpu11": "drained", "gpu12": "idle", "gpu13": "drained", "gpu14": "idle"}
    ledger.put(Nodes({n: NodeSeen(status=s, partitions=["train"]) for n, s in statuses.items()}),
               NOW)  # fmt: skip
    config = console_config(tmp_path, db, users_file)
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump({"database_url": db}))
    return Site(ledger, path, config)


def cli(site: Site, *args: str) -> Result:
    return CliRunner().invoke(main, [args[0], f"--config={site.config_path}", *args[1:]])


def test_the_ledger_holds_each_repair_where_the_core_left_it(site: Site) -> None:
    states = {r.node: (r.state, r.plan) for r, _ in site.ledger.repairs.listed(EPOCH)}
    assert states == {
        "gpu11": ("repairing", "reboot"),
        "gpu12": ("probation", "reboot"),
        "gpu13": ("replace", "reboot"),
        "gpu14": ("replace", "replace"),
    }


def test_slurmedic_nodes_lists_the_node_waiting_for_replacement_first(site: Site) -> None:
    out = cli(site, "nodes", "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    # By failures alone gpu11 (drained twice) comes first and gpu13 (drained once, three hours
    # before gpu12) third: waiting for a person puts it first. gpu14 was replaced: not first.
    assert [r["node"] for r in rows] == ["gpu13", "gpu11", "gpu12", "gpu14"]
    got = {r["node"]: r for r in rows}
    assert [got[n]["awaiting_replacement"] for n in ("gpu13", "gpu11", "gpu12", "gpu14")] == [
        True, False, False, False,
    ]  # fmt: skip
    assert got["gpu13"]["repair"]["state"] == "replace"
    assert "health check failed" in got["gpu13"]["repair"]["reason"]
    assert "GPU 3 memory: FAIL" in got["gpu13"]["repair"]["reason"]
    assert (got["gpu11"]["repair"]["state"], got["gpu11"]["repair"]["plan"]) == (
        "repairing", "reboot",
    )  # fmt: skip
    assert got["gpu11"]["failures"] == 2 and got["gpu11"]["suspect"] is True
    assert got["gpu12"]["repair"]["state"] == "probation" and got["gpu12"]["status"] == "idle"
    assert got["gpu14"]["repair"]["state"] == "replace" and got["gpu14"]["status"] == "idle"
    assert all(got[n]["repairs"] == 1 for n in got)
    # Within a week: gpu11's drains and the start of its repair, and gpu14's, are older.
    week = json.loads(cli(site, "nodes", "--json", "--since", "7d").output)
    assert [r["node"] for r in week] == ["gpu13", "gpu12"]
    table = cli(site, "nodes")
    assert table.exit_code == 0, table.output
    first = next(line for line in table.output.splitlines() if "gpu1" in line)
    assert "gpu13" in first and "replace (reboot): waiting for a person" in first


def test_slurmedic_repairs_says_where_each_stands_and_its_steps(site: Site) -> None:
    out = cli(site, "repairs", "--json", "--since", "30d")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    # Newest first: by when each began.
    assert [r["node"] for r in rows] == ["gpu12", "gpu13", "gpu11", "gpu14"]
    got = {r["node"]: r for r in rows}
    steps = {n: [(s["action"], s["state"], s["passed"]) for s in got[n]["steps"]] for n in got}
    assert steps["gpu12"] == [
        ("reboot", "executed", None),
        ("health_check", "executed", True),
        ("resume", "executed", None),
    ]
    assert steps["gpu13"] == [
        ("reboot", "executed", None),
        ("health_check", "executed", False),
        ("escalate", got["gpu13"]["steps"][-1]["state"], None),
    ]
    assert got["gpu13"]["steps"][1]["detail"] == "gpu13: exit 1: GPU 3 memory: FAIL"
    assert steps["gpu11"] == [("reboot", "running", None)]
    assert steps["gpu14"] == [("escalate", got["gpu14"]["steps"][0]["state"], None)]
    assert got["gpu14"]["why"] == "GpuRowRemapFailure"

    lines = cli(site, "repairs", "--since", "30d", "--state", "replace").output.splitlines()
    assert [line.split()[0] for line in lines] == ["repair:gpu13", "repair:gpu14"]
    assert "health_check #" in lines[0]
    assert "(failed: gpu13: exit 1: GPU 3 memory: FAIL)" in lines[0]
    # The default week: gpu11's repair began 9 days ago, gpu14's 10.
    week = cli(site, "repairs").output.splitlines()
    assert [line.split()[1] for line in week] == ["gpu12", "gpu13"]
    assert "probation since" in week[0]
    none = cli(site, "repairs", "--state", "done")
    assert none.exit_code == 0 and none.output == "no repair in state done begun in the last 7d\n"


def test_slurmedic_repairs_refuses_bad_options_in_one_line(site: Site) -> None:
    for args, named in (
        (("--state", "fixed"), "'--state'"),
        (("--since", "a week"), "'--since'"),
    ):
        out = cli(site, "repairs", *args)
        assert out.exit_code == 2, out.output
        error = [line for line in out.output.splitlines() if line.startswith("Error")]
        assert len(error) == 1 and named in error[0] and args[1] in error[0], out.output


def test_the_console_shows_each_node_s_repair_the_replacement_first(site: Site) -> None:
    client = create_app(site.config, site.ledger).test_client()
    login(client, "vera")  # a viewer reads it; nothing on it changes anything
    page = client.get("/console/nodes").get_data(as_text=True)
    rows = [page.index(f'id="node-{n}"') for n in ("gpu13", "gpu11", "gpu12", "gpu14")]
    assert rows == sorted(rows)
    gpu13 = page[rows[0] : rows[1]]
    assert 'class="replace"' in gpu13 and "waiting for replacement" in gpu13
    assert 'href="/console/incident/node:gpu13"' in gpu13  # why it left service
    assert "health check failed" in gpu13 and "GPU 3 memory: FAIL" in gpu13
    assert 'href="/console/incident/repair:gpu13"' in gpu13
    gpu11 = page[rows[1] : rows[2]]
    assert 'class="suspect"' in gpu11 and '<span class="chip repairing">repairing</span>' in gpu11
    gpu12 = page[rows[2] : rows[3]]
    assert '<span class="chip probation">probation</span>' in gpu12 and "passed" in gpu12
    gpu14 = page[rows[3] :]
    assert 'class="replace"' not in gpu14 and "<td>idle</td>" in gpu14
    assert 'method="post"' not in page.split("</header>", 1)[1]  # read-only
    login(client, "anna")
    assert client.get("/console/nodes").status_code == 200


def test_metrics_count_repairs_time_to_return_and_nodes_awaiting_replacement(
    site: Site,
) -> None:
    client = create_app(site.config, site.ledger).test_client()
    text = client.get("/metrics").get_data(as_text=True)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith(("slurmedic_repair", "slurmedic_nodes_awaiting"))
    }
    repairs_now = {
        "/".join(dict(k)[label] for label in ("state", "plan", "cause")): v
        for (name, k), v in samples.items()
        if name == "slurmedic_repairs" and v
    }
    # gpu11's repair is under way though begun 9 days ago; gpu14's closed one is past the week.
    assert repairs_now == {
        "repairing/reboot/gpu_hardware": 1,
        "probation/reboot/gpu_hardware": 1,
        "replace/reboot/gpu_hardware": 1,
    }
    zero = (("cause", ""), ("plan", "reset_gpu"), ("state", "waiting"))
    assert samples[("slurmedic_repairs", zero)] == 0
    assert samples[("slurmedic_repair_return_seconds_count", ())] == 1
    assert samples[("slurmedic_repair_return_seconds_sum", ())] == 40 * 60
    assert samples[("slurmedic_repair_return_seconds_bucket", (("le", "1800.0"),))] == 0
    assert samples[("slurmedic_repair_return_seconds_bucket", (("le", "3600.0"),))] == 1
    # gpu13 (drained); not gpu14, back in service.
    assert samples[("slurmedic_nodes_awaiting_replacement", ())] == 1


def test_the_repairs_figures_on_both_backends(ledger: Ledger) -> None:
    """/metrics' SQL of the repairs (the resume's executed event joined, each node's latest
    repair) reads alike on SQLite and PostgreSQL."""
    m = timedelta(minutes=1)
    begin(ledger, "gpu14", NOW - timedelta(days=10), "GpuRowRemapFailure")
    t = NOW - timedelta(hours=5)
    begin(ledger, "gpu12", t, "GpuMissing")
    run(ledger, step(ledger, "gpu12", t + 5 * m), t + 10 * m, run={"playbook": "reboot_nodes"})
    run(ledger, step(ledger, "gpu12", t + 15 * m), t + 30 * m, **health("gpu12", 0, "PASS"))
    run(ledger, step(ledger, "gpu12", t + 31 * m), t + 40 * m, run={"playbook": "resume_nodes"})
    step(ledger, "gpu12", t + 41 * m)
    fig = ledger.figures().repairs
    # gpu14's repair is closed and older than the week: not counted, but still its node's latest.
    assert fig.by_state == {("probation", "reboot", "gpu_hardware"): 1}
    assert fig.returned == [40 * 60]
    assert fig.replace == ["gpu14"]
