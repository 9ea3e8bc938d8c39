"""slurmedic serve against the lab: exporter -> Prometheus -> Alertmanager -> webhook -> ledger.

Monitor mode (the lab's policy): the recommendation is recorded within seconds, and Slurm is
left exactly as it was.
"""

import json
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from lab import manage, processes
from lab.config import LabConfig
from lab.slurm import slurm
from tests.lab.conftest import (
    PLAYBOOK_RUN_S,
    eventually,
    query,
    quiet,
    running_nodes,
    serve_slurmedic,
)
from webhook.ledger.schema import DecisionRow
from webhook.ledger.store import Ledger

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def ledger(lab_cfg: LabConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    yield serve_slurmedic(lab_cfg, tmp_path_factory.mktemp("monitor"), "monitor")
    processes.stop(lab_cfg, "slurmedic")


def decided(ledger: Ledger, incident: str) -> list[DecisionRow]:
    return eventually(
        lambda: [r for r in ledger.decisions(200) if r.incident == incident],
        timeout=45,
        what=f"decisions for incident {incident}",
    )


def slurm_state(cfg: LabConfig) -> tuple[str, str]:
    nodes = slurm(cfg, "sinfo", "-h", "-N", "-o", "%N %t %E")
    jobs = slurm(cfg, "squeue", "-h", "-o", "%i %t %N %r")
    return nodes, jobs


def test_xid79_is_recorded_as_drain_and_requeue_and_slurm_is_untouched(
    lab_cfg: LabConfig, ledger: Ledger, submit: Callable[..., int], clean_faults: None
) -> None:
    job = submit(nodes=3)
    nodes = running_nodes(lab_cfg, job)
    eventually(
        lambda: query(lab_cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}'), what="job mapped"
    )
    quiet(lab_cfg, job, nodes)
    before = slurm_state(lab_cfg)
    manage.inject_gpu(lab_cfg, "xid", nodes[1], 3, xid=79)
    rows = decided(ledger, f"{job}.0")
    by_action = {r.action: r for r in rows}
    assert set(by_action) == {"drain", "requeue"}
    assert by_action["drain"].nodes == [nodes[1]]
    assert by_action["requeue"].exclude == [nodes[1]]
    assert all(
        r.cause == "gpu_hardware" and r.state == "recorded" and r.mode == "monitor" for r in rows
    )
    assert by_action["drain"].evidence[0]["alertname"] == "GpuXidNodeFault"
    # What each would disrupt, from the GPUs Slurm's gres gives the nodes (the trial report).
    assert by_action["drain"].gpus == lab_cfg.gpus_per_node
    assert by_action["requeue"].gpus == 3 * lab_cfg.gpus_per_node
    assert by_action["requeue"].gpu_hours is not None and by_action["requeue"].gpu_hours > 0

    # The check-mode run is recorded with the exact commands enforce mode would run.
    def dry_run(row: DecisionRow) -> list[str]:
        _, events = ledger.decision(row.id)  # type: ignore[misc]
        return next((e.detail["dry_run"]["commands"] for e in events if "dry_run" in e.detail), [])

    assert eventually(
        lambda: dry_run(by_action["drain"]), timeout=PLAYBOOK_RUN_S, what="dry run of the drain"
    ) == [
        f'scontrol update nodename={nodes[1]} state=drain reason="slurmedic: {job}.0 gpu_hardware"'
    ]
    assert eventually(
        lambda: dry_run(by_action["requeue"]), timeout=PLAYBOOK_RUN_S, what="dry run of the requeue"
    ) == [
        f"scontrol requeuehold {job}",
        f"scontrol update jobid={job} ExcNodeList={nodes[1]}",
        f"scontrol release {job}",
    ]
    # Monitor mode never changes the scheduler.
    assert slurm_state(lab_cfg) == before


def test_the_silent_rank_of_an_nccl_hang_is_implicated(
    lab_cfg: LabConfig, ledger: Ledger, submit: Callable[..., int]
) -> None:
    job = submit(nodes=3)
    nodes = running_nodes(lab_cfg, job)
    eventually(
        lambda: query(lab_cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}'), what="job mapped"
    )
    quiet(lab_cfg, job, nodes)
    manage.inject_job(lab_cfg, "hang", job, 1)
    rows = decided(ledger, f"{job}.0")
    by_action = {r.action: r for r in rows}
    why = [(r.action, r.cause, r.reason, r.evidence) for r in rows]
    assert by_action["drain"].nodes == [nodes[1]], why
    assert by_action["drain"].cause == "node_failure", why
    assert by_action["requeue"].exclude == [nodes[1]]


def test_an_application_crash_stops_the_job_and_drains_nothing(
    lab_cfg: LabConfig, ledger: Ledger, submit: Callable[..., int]
) -> None:
    job = submit(nodes=2)
    quiet(lab_cfg, job, running_nodes(lab_cfg, job))
    eventually(
        lambda: query(lab_cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}'), what="job mapped"
    )
    manage.inject_job(lab_cfg, "crash_cuda", job, 0, 1)  # every rank alike: the code's
    rows = decided(ledger, f"{job}.0")
    assert [(r.action, r.cause) for r in rows] == [("stop", "application")], [
        (r.action, r.cause, r.evidence) for r in rows
    ]


def test_a_drill_in_monitor_mode_is_a_dry_run_of_the_interruption(
    lab_cfg: LabConfig, ledger: Ledger, submit: Callable[..., int]
) -> None:
    job = submit(nodes=2)
    nodes = running_nodes(lab_cfg, job)
    before = slurm_state(lab_cfg)
    asked = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "drill",
            str(job),
            "--exclude",
            nodes[1],
            f"--config={lab_cfg.slurmedic_config}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert asked.returncode == 0 and f"of job {job} asked for now" in asked.stdout, asked
    (row,) = decided(ledger, f"drill:{job}.0")
    assert (row.action, row.cause, row.mode, row.exclude) == (
        "requeue",
        "drill",
        "monitor",
        [nodes[1]],
    )
    # Its dry run shows what it would send Slurm; Slurm is left as it was.
    dry = eventually(
        lambda: next(
            (e.detail["dry_run"] for e in ledger.decision(row.id)[1] if "dry_run" in e.detail),  # type: ignore[index]
            None,
        ),
        timeout=PLAYBOOK_RUN_S,
        what="the drill's dry run",
    )
    assert f"scontrol requeuehold {job}" in dry["commands"], dry
    assert f"scontrol update jobid={job} ExcNodeList={nodes[1]}" in dry["commands"], dry
    assert slurm_state(lab_cfg) == before
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "drills",
            "--json",
            f"--config={lab_cfg.slurmedic_config}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (drill,) = [d for d in json.loads(listed.stdout) if d["job"] == job]
    assert drill["outcome"] == "dry_run", drill
