"""Each fault class, injected in the lab, reaches the webhook through the real Alertmanager.

Prometheus evaluates the repo's rules (lab profile: short windows) on the lab's exporters and
mtail; Alertmanager routes with the repo's example config; a test receiver stands where
slurmedic's webhook will. Each test checks the alert's `node`, `slurm_job_id` and `signal`.
"""

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lab import api, manage, monitoring, processes, stacks
from lab.config import LabConfig
from lab.dcgm_exporter import gpu_uuid
from tests.lab.conftest import Receiver, eventually, query, running_nodes

pytestmark = pytest.mark.lab


def delivered(
    receiver: Receiver, alertname: str, since: float, timeout: float = 40.0, **labels: str
) -> dict[str, Any]:
    found = eventually(
        lambda: receiver.alerts(alertname, since=since, **labels),
        timeout=timeout,
        what=f"{alertname} {labels} at the webhook",
    )
    return found[0]


def running_job(
    lab_cfg: LabConfig, submit: Callable[..., int], nodes: int = 2
) -> tuple[int, list[str]]:
    job = submit(nodes=nodes)
    names = running_nodes(lab_cfg, job)
    # Every GPU of every node is mapped to the job (dcgm hpc_job) in Prometheus before the
    # fault: each test here is about one alert of a running job (the fault at the job's start
    # has a test of its own).
    eventually(
        lambda: len(query(lab_cfg, f'DCGM_FI_DEV_GPU_UTIL{{hpc_job="{job}"}}')) == 8 * nodes,
        what="all the job's GPUs mapped",
    )
    eventually(
        lambda: len(query(lab_cfg, f'slurmedic:job:running{{slurm_job_id="{job}"}}')) == 1,
        what="job visible as running",
    )
    return job, names


# Each fault class, the alert it raises, its signal.
FAULTS = [
    ({"kind": "xid", "xid": 79}, "GpuXidNodeFault", "gpu_hw"),
    ({"kind": "xid", "xid": 13}, "GpuXidApplicationFault", "gpu_app"),
    ({"kind": "ecc_dbe", "count": 2}, "GpuDoubleBitEccErrors", "gpu_hw"),
    # A failed row remap raises both alerts, in the same job attempt.
    ({"kind": "row_remap_failure"}, "GpuRowRemapFailure+GpuUncorrectableRemappedRows", "gpu_hw"),
    # Corrected errors: the GPU still works (docs/operations.md, gpu_degraded).
    ({"kind": "nvlink", "rate": 50}, "GpuNvlinkErrors", "gpu_degraded"),
    ({"kind": "pcie", "rate": 200}, "GpuPcieReplays", "gpu_degraded"),
    ({"kind": "thermal"}, "GpuThrottled", "straggler"),
    ({"kind": "gpu_lost"}, "GpuMissing", "gpu_hw"),
]


@pytest.mark.parametrize(("inject", "alertname", "signal"), FAULTS)
def test_gpu_fault_reaches_the_webhook(
    lab_cfg: LabConfig,
    receiver: Receiver,
    submit: Callable[..., int],
    clean_faults: None,
    inject: dict[str, Any],
    alertname: str,
    signal: str,
) -> None:
    job, nodes = running_job(lab_cfg, submit)
    since = time.time()
    inject = dict(inject)
    kind = inject.pop("kind")
    # Each fault class on a GPU of its own: a cleared fault of the previous test (same node,
    # maybe) must not be this test's evidence, nor its counter reset this test's noise.
    gpu = [f[1] for f in FAULTS].index(alertname) % 8
    manage.inject_gpu(lab_cfg, kind, nodes[1], gpu, **inject)
    # The alert for this job: an earlier test's fault on the same node may still be firing
    # (its window has not passed) under that test's job id.
    labels = {} if alertname == "GpuMissing" else {"slurm_job_id": str(job)}
    for name in alertname.split("+"):
        alert = delivered(receiver, name, since, node=nodes[1], gpu=str(gpu), **labels)
        # GpuMissing names no job: its lookback also sees jobs that ended (see the rule).
        assert alert["labels"].get("slurm_job_id") == (None if name == "GpuMissing" else str(job))
        assert alert["labels"]["signal"] == signal
        assert alert["labels"]["gpu"] == str(gpu)
        # The GPU's identity, dcgm-exporter's UUID, as `uuid`.
        assert alert["labels"]["uuid"] == gpu_uuid(nodes[1], gpu)
        # Nothing about the healthy node of the same job.
        assert not receiver.alerts(name, since=since, node=nodes[0], **labels)


def test_an_ecc_error_as_the_job_starts_is_caught_with_the_job(
    lab_cfg: LabConfig, receiver: Receiver, submit: Callable[..., int], clean_faults: None
) -> None:
    """The count rises around the scrape where the GPU's series first carries the new job
    (dcgm's hpc_job): before or after it, the alert names the job (increase() over the new
    series alone could not see it)."""
    job = submit(nodes=2)
    nodes = running_nodes(lab_cfg, job)
    since = time.time()
    manage.inject_gpu(lab_cfg, "ecc_dbe", nodes[1], 2, count=1)  # no wait for the mapping
    alert = delivered(
        receiver, "GpuDoubleBitEccErrors", since, node=nodes[1], gpu="2", slurm_job_id=str(job)
    )
    assert alert["labels"]["signal"] == "gpu_hw"


def test_alertmanager_sends_the_bearer_token(
    lab_cfg: LabConfig, receiver: Receiver, clean_faults: None
) -> None:
    since = time.time()
    manage.inject_gpu(lab_cfg, "xid", "gpu08", 0, xid=64)
    delivered(receiver, "GpuXidNodeFault", since, node="gpu08", xid="64")
    token = lab_cfg.webhook_token_file.read_text().strip()
    sent = [n for n in receiver.notifications if n["at"] >= since and n["path"] == "/api/v1/alerts"]
    assert sent and all(n["authorization"] == f"Bearer {token}" for n in sent)
    # An idle node's fault has no job to name.
    alert = receiver.alerts("GpuXidNodeFault", since=since, node="gpu08")[0]
    assert "slurm_job_id" not in alert["labels"]


def test_ignore_class_xid_stays_silent(
    lab_cfg: LabConfig, receiver: Receiver, clean_faults: None
) -> None:
    since = time.time()
    manage.inject_gpu(lab_cfg, "xid", "gpu07", 1, xid=43)  # IGNORE in NVIDIA's catalog
    manage.inject_gpu(lab_cfg, "xid", "gpu07", 2, xid=79)  # a marker that rules were evaluated
    delivered(receiver, "GpuXidNodeFault", since, node="gpu07", gpu="2")
    xid43 = 'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu07",gpu="1"} == 43'
    assert eventually(lambda: query(lab_cfg, xid43), what="XID 43 scraped")
    assert not query(lab_cfg, 'ALERTS{node="gpu07",gpu="1"}')
    assert not [
        a
        for a in receiver.alerts("GpuXidNodeFault", since=since, node="gpu07")
        if a["labels"]["gpu"] == "1"
    ]


def test_killed_node_is_node_down_and_silences_its_gpu_alerts(
    lab_cfg: LabConfig, receiver: Receiver, submit: Callable[..., int], clean_faults: None
) -> None:
    job, nodes = running_job(lab_cfg, submit)
    since = time.time()
    manage.inject_gpu(lab_cfg, "xid", nodes[0], 0, xid=79)
    delivered(receiver, "GpuXidNodeFault", since, node=nodes[0])
    manage.kill_node(lab_cfg, nodes[0])
    alert = delivered(receiver, "SlurmNodeDown", since, timeout=60, node=nodes[0])
    assert alert["labels"]["signal"] == "node_down"

    # The GPU alert of the dead node is now inhibited in Alertmanager.
    def inhibited() -> bool:
        gpu = api.alerts(lab_cfg, alertname="GpuXidNodeFault", node=nodes[0])
        return bool(gpu) and all(a["status"]["inhibitedBy"] for a in gpu)

    eventually(inhibited, what="GPU alert inhibited by SlurmNodeDown")
    assert manage.show_job(lab_cfg, job)["JobState"] in ("PENDING", "RUNNING", "CONFIGURING")


def test_a_no_requeue_job_on_a_dead_node_is_jobs_node_fail(
    lab_cfg: LabConfig, receiver: Receiver, submit: Callable[..., int], clean_faults: None
) -> None:
    """A --no-requeue job ends NODE_FAIL when its node dies: SlurmJobsNodeFail, from the source
    the lab's rules read counts from. Where Slurm serves its own metrics (25.11+) the lab's
    Slurm exporter is stopped first: the alert can only come from slurmctld's count."""
    native = stacks.get(lab_cfg.stack).slurm_metrics
    eventually(
        lambda: not api.alerts(lab_cfg, alertname="SlurmJobsNodeFail"),
        timeout=90,
        what="no earlier SlurmJobsNodeFail",
    )
    job = submit(nodes=2, requeue=False)
    nodes = running_nodes(lab_cfg, job)
    since = time.time()
    if native:
        assert processes.stop(lab_cfg, "slurm-exporter")
    try:
        manage.kill_node(lab_cfg, nodes[1])
        eventually(
            lambda: manage.show_job(lab_cfg, job)["JobState"] == "NODE_FAIL",
            timeout=60,
            what="the job ended NODE_FAIL",
        )
        alert = delivered(receiver, "SlurmJobsNodeFail", since, timeout=60)
        assert alert["labels"]["signal"] == "node_down" and "node" not in alert["labels"]
        if native:
            assert query(lab_cfg, 'slurm_jobs_node_failed{job="slurmctld-jobs"} > 0')
            assert not query(lab_cfg, "slurm_jobs_node_fail")  # no exporter series behind it
    finally:
        monitoring.start(lab_cfg)  # the exporter again (the others are left alone)
        monitoring.wait_ready(lab_cfg)


def test_hang_reaches_the_webhook_as_hang_and_nccl_timeouts(
    lab_cfg: LabConfig, receiver: Receiver, submit: Callable[..., int]
) -> None:
    job, nodes = running_job(lab_cfg, submit, nodes=3)
    since = time.time()
    manage.inject_job(lab_cfg, "hang", job, 1)
    for rank in (0, 2):
        alert = delivered(
            receiver, "TrainingNcclTimeout", since, slurm_job_id=str(job), rank=str(rank)
        )
        assert alert["labels"]["node"] == nodes[rank]
        assert alert["labels"]["signal"] == "nccl_timeout"
    hang = delivered(receiver, "TrainingHang", since, slurm_job_id=str(job), rank="1")
    assert hang["labels"]["node"] == nodes[1] and hang["labels"]["signal"] == "hang"
    # The silent rank logged nothing.
    assert not receiver.alerts("TrainingNcclTimeout", since=since, slurm_job_id=str(job), rank="1")


@pytest.mark.parametrize(
    ("kind", "alertname", "signal"),
    [
        ("crash_cuda", "TrainingCudaError", "app_error"),
        ("crash_ecc", "TrainingGpuHardwareError", "gpu_hw"),
    ],
)
def test_crashed_rank_reaches_the_webhook(
    lab_cfg: LabConfig,
    receiver: Receiver,
    submit: Callable[..., int],
    kind: str,
    alertname: str,
    signal: str,
) -> None:
    job, nodes = running_job(lab_cfg, submit)
    since = time.time()
    manage.inject_job(lab_cfg, kind, job, 1)  # type: ignore[arg-type]
    alert = delivered(receiver, alertname, since, slurm_job_id=str(job), rank="1")
    assert alert["labels"]["node"] == nodes[1]
    assert alert["labels"]["signal"] == signal
    tb = delivered(receiver, "TrainingPythonTraceback", since, slurm_job_id=str(job), rank="1")
    assert tb["labels"]["signal"] == "app_error"


def tailing(cfg: LabConfig, log: Path) -> None:
    """Start a job log and wait until mtail reads it: mtail starts a file it finds at its end
    (3.0.0-rc50 too when the file is new), so a line written before would be lost."""

    def read() -> bool:
        with log.open("a") as f:
            f.write("srun: job step starting\n")
        with urllib.request.urlopen(f"{cfg.url(cfg.mtail_port)}/metrics", timeout=5) as r:
            return f'logfile="{log}"' in r.read().decode()

    eventually(read, interval=0.5, what=f"mtail reading {log.name}")


def test_a_task_that_fails_again_within_the_window_is_a_new_alert(
    lab_cfg: LabConfig, receiver: Receiver
) -> None:
    """A requeued attempt on the same node that fails within `joblog_window` of the last
    failure: the rule names each failure by its line's time, so the second is an alert of its
    own (slurmedic sees a new failure), and the first one resolves."""
    # Slurm's task summary in a batch output file, as srun writes it when a task exits non-zero
    # (the lab's own jobs write their batch output elsewhere). A job id no lab job has.
    job, node = str(900000 + int(time.time()) % 90000), lab_cfg.nodes[0]
    batch = lab_cfg.joblogs / f"slurm-{job}.out"
    line = f"srun: error: {node}: task 1: Exited with exit code 1\n"
    tailing(lab_cfg, batch)
    since = time.time()
    with batch.open("a") as f:
        f.write(line)
    first = delivered(receiver, "TrainingTaskFailed", since, slurm_job_id=job, node=node)
    assert first["labels"]["rank"] == "1" and first["labels"]["signal"] == "app_error"
    failed_at = int(first["labels"]["failed_at"])
    assert since - 1 <= failed_at <= time.time()
    # mtail stamps a line with the second it read it: the next one must come a second later.
    eventually(lambda: time.time() >= failed_at + 1, what="the next second")
    with batch.open("a") as f:
        f.write(line)
    second = eventually(
        lambda: [
            a
            for a in receiver.alerts("TrainingTaskFailed", since=since, slurm_job_id=job)
            if a["labels"]["failed_at"] != str(failed_at)
        ],
        timeout=40.0,
        what="a second TrainingTaskFailed",
    )[0]
    assert int(second["labels"]["failed_at"]) > failed_at
    assert second["fingerprint"] != first["fingerprint"]

    def resolved() -> bool:
        with receiver.lock:
            return any(
                a["status"] == "resolved" and a["fingerprint"] == first["fingerprint"]
                for n in receiver.notifications
                for a in n["payload"]["alerts"]
            )

    eventually(resolved, timeout=40.0, what="the first failure's alert resolved")


def test_slow_rank_is_a_straggler(
    lab_cfg: LabConfig, receiver: Receiver, submit: Callable[..., int]
) -> None:
    job, nodes = running_job(lab_cfg, submit, nodes=3)
    since = time.time()
    manage.inject_job(lab_cfg, "slow", job, 2, factor=4.0)
    alert = delivered(receiver, "TrainingStraggler", since, slurm_job_id=str(job))
    assert (alert["labels"]["node"], alert["labels"]["rank"]) == (nodes[2], "2")
    assert alert["labels"]["signal"] == "straggler"
    assert not receiver.alerts("TrainingStraggler", since=since, slurm_job_id=str(job), rank="0")
