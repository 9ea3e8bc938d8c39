"""The training simulator: progress to Prometheus, log lines to mtail, resume after requeue."""

import os
import signal
from collections.abc import Callable

import pytest

from lab import manage, processes
from lab.config import LabConfig
from lab.slurm import slurm
from tests.lab.conftest import eventually, joblog, next_attempt, query, running_nodes

pytestmark = pytest.mark.lab


def steps(cfg: LabConfig, job: int) -> dict[str, float]:
    """rank -> training_step in Prometheus, for the job's current attempt."""
    return {
        s["labels"]["rank"]: s["value"]
        for s in query(cfg, f'training_step{{slurm_job_id="{job}"}}')
    }


def test_progress_reaches_prometheus(lab_cfg: LabConfig, submit: Callable[..., int]) -> None:
    job = submit(nodes=3)
    nodes = running_nodes(lab_cfg, job)
    first = eventually(
        lambda: (s := steps(lab_cfg, job)) and len(s) == 3 and min(s.values()) > 0 and s,
        what="progress of 3 ranks",
    )
    later = eventually(
        lambda: (s := steps(lab_cfg, job)) and min(s.values()) > max(first.values()) and s,
        what="progress advancing",
    )
    assert set(later) == {"0", "1", "2"}
    # Each rank reports from the node Slurm put it on.
    by_rank = {
        s["labels"]["rank"]: s["labels"]["node"]
        for s in query(lab_cfg, f'training_step{{slurm_job_id="{job}"}}')
    }
    assert sorted(by_rank.values()) == sorted(nodes)
    ckpt = eventually(
        lambda: query(lab_cfg, f'min(training_last_checkpoint_step{{slurm_job_id="{job}"}}) >= 5'),
        what="a checkpoint",
    )
    assert ckpt[0]["value"] % 5 == 0


def trained(cfg: LabConfig, job: int) -> int:
    """The last step every rank of the job's first attempt finished, from the ranks' own
    record (the files their collective reads), not from what they pushed."""
    found = [
        int(p.read_text() or 0) for p in (cfg.jobs / str(job) / "progress" / "0").glob("rank*")
    ]
    return min(found) if found else 0


def test_a_hung_pushgateway_holds_no_step_back(
    lab_cfg: LabConfig, submit: Callable[..., int]
) -> None:
    """The Pushgateway stopped (SIGSTOP: it takes connections and never answers) while a job
    trains: the ranks keep stepping and checkpointing, and once it answers again their progress
    reaches Prometheus. (What a step costs meanwhile is measured: bench.reporter_cost.)"""
    job = submit(nodes=2)
    running_nodes(lab_cfg, job)
    eventually(lambda: len(steps(lab_cfg, job)) == 2, what="progress of 2 ranks")
    pid = processes.read_pid(lab_cfg, "pushgateway")
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        at_stop = trained(lab_cfg, job)
        # Two checkpoints' worth of steps (ckpt_every 10) while every push hangs.
        eventually(
            lambda: trained(lab_cfg, job) >= at_stop + 20,
            timeout=90,
            what="20 steps while it hangs",
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    eventually(
        lambda: min(steps(lab_cfg, job).values()) >= at_stop + 20,
        timeout=60,
        what="the steps trained meanwhile in Prometheus",
    )


def test_mtail_counts_nccl_timeouts_of_the_ranks_left_waiting(
    lab_cfg: LabConfig, submit: Callable[..., int]
) -> None:
    job = submit(nodes=3)
    nodes = running_nodes(lab_cfg, job)
    eventually(lambda: len(steps(lab_cfg, job)) == 3, what="progress")
    manage.inject_job(lab_cfg, "hang", job, 1)
    promql = f'training_log_nccl_timeouts_total{{slurm_job_id="{job}"}}'
    series = eventually(
        lambda: (r := query(lab_cfg, promql)) and len(r) == 2 and r,
        timeout=30,
        what="two ranks' NCCL timeouts in Prometheus",
    )
    counted = {(s["labels"]["rank"], s["labels"]["node"]): s["value"] for s in series}
    # Rank 1 hung silently: it is the one the others waited for, and it logged nothing.
    assert counted == {("0", nodes[0]): 1.0, ("2", nodes[2]): 1.0}
    assert (
        "Watchdog caught collective operation timeout"
        in joblog(lab_cfg, job, nodes[0], 0).read_text()
    )
    assert "Watchdog" not in joblog(lab_cfg, job, nodes[1], 1).read_text()
    # The hung rank keeps the job alive: Slurm still says RUNNING.
    assert manage.show_job(lab_cfg, job)["JobState"] == "RUNNING"


def test_a_cuda_crash_is_logged_and_counted(lab_cfg: LabConfig, submit: Callable[..., int]) -> None:
    job = submit(nodes=2)
    nodes = running_nodes(lab_cfg, job)
    eventually(lambda: len(steps(lab_cfg, job)) == 2, what="progress")
    manage.inject_job(lab_cfg, "crash_cuda", job, 0)
    r = eventually(
        lambda: query(lab_cfg, f'training_log_cuda_errors_total{{slurm_job_id="{job}"}}'),
        what="CUDA error counted",
    )
    assert [(s["labels"]["rank"], s["labels"]["node"]) for s in r] == [("0", nodes[0])]
    text = joblog(lab_cfg, job, nodes[0], 0).read_text()
    assert "[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered" in text
    # The other rank times out waiting for the dead one, and the job fails.
    eventually(
        lambda: manage.show_job(lab_cfg, job)["JobState"] == "FAILED", timeout=30, what="job FAILED"
    )


def test_a_slow_rank_reports_longer_steps(lab_cfg: LabConfig, submit: Callable[..., int]) -> None:
    job = submit(nodes=2)
    running_nodes(lab_cfg, job)
    eventually(lambda: len(steps(lab_cfg, job)) == 2, what="progress")
    manage.inject_job(lab_cfg, "slow", job, 1, factor=4.0)
    promql = f'training_step_seconds{{slurm_job_id="{job}"}}'

    def ratio() -> float:
        s = {x["labels"]["rank"]: x["value"] for x in query(lab_cfg, promql)}
        return s["1"] / s["0"] if s.get("0") else 0.0

    assert eventually(lambda: ratio() > 3.0, what="rank 1 four times slower")


def test_requeued_job_resumes_from_its_checkpoint(
    lab_cfg: LabConfig, submit: Callable[..., int]
) -> None:
    job = submit(nodes=3)
    nodes = running_nodes(lab_cfg, job)
    ckpt_q = f'min(training_last_checkpoint_step{{slurm_job_id="{job}"}})'
    eventually(lambda: (r := query(lab_cfg, ckpt_q)) and r[0]["value"] >= 10, what="checkpoint 10")
    bad = nodes[1]
    # The requeue with exclusion (docs/architecture.md): requeuehold, ExcNodeList, release.
    slurm(lab_cfg, "scontrol", "requeuehold", str(job))
    slurm(lab_cfg, "scontrol", "update", f"jobid={job}", f"ExcNodeList={bad}")
    slurm(lab_cfg, "scontrol", "release", str(job))
    new_nodes = next_attempt(lab_cfg, job)
    assert bad not in new_nodes, new_nodes
    # Every rank of attempt 1 says where it resumed, and it is not step 0.
    resumed = []
    for rank, node in enumerate(new_nodes):
        line = eventually(
            lambda n=node, r=rank: [
                ln
                for ln in joblog(lab_cfg, job, n, r).read_text().splitlines()
                if "attempt 1" in ln
            ],
            what=f"rank {rank} restarted",
        )[0]
        assert "resuming from checkpoint at step" in line, line
        resumed.append(int(line.rsplit(" ", 1)[1]))
    start = min(resumed)
    assert start >= 10
    attempt_q = f'min(training_attempt{{slurm_job_id="{job}"}})'
    eventually(
        lambda: (r := query(lab_cfg, attempt_q)) and r[0]["value"] == 1, what="attempt 1 reported"
    )
    eventually(
        lambda: (
            (r := query(lab_cfg, f'min(training_step{{slurm_job_id="{job}"}})'))
            and r[0]["value"] > start
        ),
        what="progress past the checkpoint",
    )
