"""Acting on Slurm through slurmrestd (`cluster.slurm: rest`): the playbooks' `scontrol` and
`scancel` stand-ins (adapters/rest_commands.py) against the real slurmrestd and scontrol of the
lab's release:

- each field the playbooks read is what scontrol prints, for nodes and jobs in the states
  remediation meets;
- a drain and a resume reach Slurm where the API has a node update (23.02 on), and one line
  says why not on 22.05;
- `slurmedic doctor` says what the playbooks can do through the release's API;
- slurmedic in enforce mode with no Slurm command of its own: an XID under a training job
  drains the node and requeues the job away from it on 26.05; on the releases whose API has
  no requeue, the drain runs and the requeue fails saying so.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import manage
from lab.config import LabConfig
from lab.slurm import node_states, slurm
from tests.lab.conftest import (
    eventually,
    lab_policy,
    next_attempt,
    running_nodes,
    serve_slurmedic,
)
from tests.lab.test_cluster import rest_config
from tests.lab.test_deploy import doctor
from tests.lab.test_remediation import decided, failures, heal, restore, xid_79_under_a_seen_job
from webhook.adapters.slurmrest import SlurmRest, version
from webhook.ledger.store import Ledger
from webhook.service.config import load_config

pytestmark = pytest.mark.lab
NODE_FIELDS = ("Gres", "State", "Reason")
JOB_FIELDS = ("JobState", "Reason", "Requeue", "Restarts", "ExitCode", "NodeList", "ExcNodeList")


@pytest.fixture(scope="module")
def rest(lab_cfg: LabConfig, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's slurmedic config over slurmrestd (a token made for it)."""
    return rest_config(lab_cfg, tmp_path_factory.mktemp("rest") / "rest.yml")


@pytest.fixture(scope="module")
def api(rest: Path) -> int:
    """The API version slurmedic calls on this stack: the newest its slurmrestd serves (v0.0.38
    on 22.05, v0.0.42 on 24.11, v0.0.45 on 26.05)."""
    reader = load_config(rest).cluster.reader()
    assert isinstance(reader, SlurmRest)
    return version(reader.api())


@pytest.fixture(scope="module")
def rest_env(rest: Path) -> dict[str, str]:
    """What the executor gives the playbooks over REST: the stand-ins first on PATH and the
    settings they call slurmrestd by (no SLURM_CONF: the real commands could not run)."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    return {**env, **load_config(rest).cluster.playbook_env()}


def over_rest(
    env: dict[str, str], *argv: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=check)


def fields(line: str, names: tuple[str, ...]) -> dict[str, str]:
    """The fields `names` of a `--oneliner` line; a reason runs to ` [user@time]`. No nodes
    reads the same printed either way (`NodeList=` on 24.11, `(null)` elsewhere): the playbooks
    read a node list only of a job that runs."""
    found = {}
    for name in names:
        m = re.search(rf"(?:^| ){name}=(.*?)(?= \[| [A-Za-z]+=|$)", line)
        found[name] = m[1] if m else "<missing>"
        if name.endswith("NodeList") and found[name] == "(null)":
            found[name] = ""
    return found


def test_the_stand_ins_show_what_scontrol_shows(
    lab_cfg: LabConfig, rest_env: dict[str, str], submit: Callable[..., int]
) -> None:
    job = submit(nodes=2, exclude="gpu0[7-8]")
    nodes = running_nodes(lab_cfg, job)
    slurm(lab_cfg, "scontrol", "requeue", str(job))  # restarts 1, with its exclusion
    eventually(lambda: manage.running_job(lab_cfg, job)[1] == 1, timeout=60, what="requeued")
    # Held after a requeue, as the requeue playbook leaves a job between its two acts.
    held = submit(nodes=1, partition="debug")
    running_nodes(lab_cfg, held)
    slurm(lab_cfg, "scontrol", "requeuehold", str(held))
    idle = sorted(n for n, s in node_states(lab_cfg).items() if s == "idle")[0]
    slurm(lab_cfg, "scontrol", "update", f"nodename={idle}", "state=drain",
          "reason=slurmedic: node:gpu03 gpu_hardware xid 79")  # fmt: skip
    try:
        for name in sorted({*nodes, idle, "gpu08"}):
            want = slurm(lab_cfg, "scontrol", "show", "node", name, "--oneliner")
            got = over_rest(rest_env, "scontrol", "show", "node", name, "--oneliner").stdout
            assert fields(got, NODE_FIELDS) == fields(want, NODE_FIELDS), (want, got)
        for j in (job, held):
            # A job's state can move between two reads (a requeued one starting): read again.
            seen: list[tuple[dict[str, str], dict[str, str]]] = []

            def same(j: int = j, seen: list[tuple[dict[str, str], dict[str, str]]] = seen) -> bool:
                want = slurm(lab_cfg, "scontrol", "show", "job", str(j), "--oneliner")
                got = over_rest(rest_env, "scontrol", "show", "job", str(j), "--oneliner").stdout
                seen.append((fields(got, JOB_FIELDS), fields(want, JOB_FIELDS)))
                return seen[-1][0] == seen[-1][1]

            try:
                eventually(same, timeout=30, what=f"job {j} as scontrol shows it")
            except AssertionError as e:
                raise AssertionError(f"{e}: (over REST, scontrol): {seen[-1:]}") from None
        hosts = over_rest(rest_env, "scontrol", "show", "hostnames", "gpu[01-03]").stdout
        assert hosts.split() == ["gpu01", "gpu02", "gpu03"]
    finally:
        slurm(lab_cfg, "scontrol", "update", f"nodename={idle}", "state=resume")
        slurm(lab_cfg, "scancel", str(held))


def test_a_drain_and_a_resume_over_slurmrestd_reach_slurm(
    lab_cfg: LabConfig, rest_env: dict[str, str], api: int
) -> None:
    node = "gpu08"
    reason = "slurmedic: node:gpu08 gpu_hardware"
    drain = over_rest(rest_env, "scontrol", "update", f"nodename={node}", "state=drain",
                      f"reason={reason}", check=False)  # fmt: skip
    if api < 39:
        assert drain.returncode == 1
        assert "slurmrestd v0.0.38 has no node update (Slurm 23.02" in drain.stderr
        assert node_states(lab_cfg)[node] == "idle"
        return
    try:
        assert drain.returncode == 0, drain.stderr
        info = slurm(lab_cfg, "scontrol", "show", "node", node, "--oneliner")
        assert "+DRAIN" in info and f"Reason={reason} [" in info
        over_rest(rest_env, "scontrol", "update", f"nodename={node}", "state=resume")
        info = slurm(lab_cfg, "scontrol", "show", "node", node, "--oneliner")
        assert "DRAIN" not in info and f"Reason={reason}" not in info, info
    finally:
        heal(lab_cfg)


def test_doctor_says_what_the_playbooks_can_do_over_this_api(
    lab_cfg: LabConfig, rest: Path, api: int, tmp_path: Path
) -> None:
    policy = lab_policy(tmp_path, "enforce", repairs={"enabled": True})
    _, found = doctor(lab_cfg, policy, config=rest)
    assert found["slurm"]["status"] == "ok", found["slurm"]
    acts = found["slurm acts"]
    assert acts["detail"].startswith(f"over slurmrestd v0.0.{api} the playbooks can "), acts
    if api >= 45:
        assert acts["status"] == "ok" and acts["detail"].endswith("; not reboot"), acts
    else:
        assert acts["status"] == "warn" and "requeue" in acts["detail"].split("; not ")[1], acts
    assert found["slurm reboots"]["status"] == "warn"
    assert "repairs.reboot: false" in found["slurm reboots"]["fix"]


@pytest.fixture
def served_over_rest(
    lab_cfg: LabConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ledger]:
    """slurmedic in enforce mode reading and acting on Slurm through slurmrestd only."""
    kept = lab_cfg.slurmedic_config.read_text()
    config = rest_config(lab_cfg, tmp_path_factory.mktemp("served-rest") / "rest.yml")
    lab_cfg.slurmedic_config.write_text(config.read_text())
    try:
        yield serve_slurmedic(lab_cfg, tmp_path_factory.mktemp("enforce-rest"), "enforce")
    finally:
        lab_cfg.slurmedic_config.write_text(kept)
        restore(lab_cfg)


def test_enforce_over_slurmrestd_drains_and_requeues_where_the_api_can(
    lab_cfg: LabConfig, served_over_rest: Ledger, submit: Callable[..., int], api: int
) -> None:
    ledger = served_over_rest
    job, bad = xid_79_under_a_seen_job(lab_cfg, submit)
    rows = decided(lab_cfg, ledger, f"{job}.0", 2, {"executed", "failed"})
    states = {a: r.state for a, r in rows.items()}
    info = slurm(lab_cfg, "scontrol", "show", "node", bad, "--oneliner")
    if api >= 45:
        assert states == {"drain": "executed", "requeue": "executed"}, failures(ledger, rows)
        assert f"Reason=slurmedic: {job}.0 gpu_hardware" in info
        _, events = ledger.decision(rows["requeue"].id)  # type: ignore[misc]
        ran = next(e.detail["run"]["commands"] for e in events if "run" in e.detail)
        assert ran == [f"scontrol requeuehold {job}",
                       f"scontrol update jobid={job} ExcNodeList={bad}",
                       f"scontrol release {job}"]  # fmt: skip
        assert bad not in next_attempt(lab_cfg, job)
        return
    # No requeue in this API: the requeue fails saying why; the job is left to a person. With
    # no node update either (22.05), the drain fails saying why, and the requeue never runs.
    assert states == {"drain": "failed" if api < 39 else "executed", "requeue": "failed"}, failures(
        ledger, rows
    )
    why = failures(ledger, rows)
    if api >= 39:
        assert "DRAIN" in info
        assert "has no requeue (Slurm 26.05 (v0.0.45) and later have one)" in why, why
    else:
        assert "has no node update (Slurm 23.02 (v0.0.39) and later have one)" in why, why
        assert "failed first" in why, why
    slurm(lab_cfg, "scancel", str(job))
