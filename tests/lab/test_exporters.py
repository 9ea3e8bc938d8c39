"""The fake DCGM exporter and the Slurm exporter, read through the real Prometheus."""

from collections.abc import Callable

import pytest

from lab import api, manage
from lab.config import LabConfig
from lab.slurm import slurm
from tests.lab.conftest import eventually, query, running_nodes, scrape

pytestmark = pytest.mark.lab


def dcgm(cfg: LabConfig, node: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return scrape(f"{cfg.url(cfg.dcgm_port(node))}/metrics")


def test_dcgm_series_carry_the_job_holding_the_node(
    lab_cfg: LabConfig, submit: Callable[..., int]
) -> None:
    job = submit(nodes=2)
    nodes = running_nodes(lab_cfg, job)
    r = eventually(
        lambda: (
            (x := query(lab_cfg, f'DCGM_FI_DEV_GPU_UTIL{{hpc_job="{job}"}}')) and len(x) == 16 and x
        ),
        what="16 GPUs mapped to the job",
    )
    assert {s["labels"]["Hostname"] for s in r} == set(nodes)
    assert {s["labels"]["gpu"] for s in r} == {str(g) for g in range(8)}
    assert all(s["value"] > 90 for s in r)  # the job loads its GPUs
    idle = next(n for n in lab_cfg.nodes if n not in nodes and n != "gpu08")
    labels = [lb for lb, _ in dcgm(lab_cfg, idle)["DCGM_FI_DEV_GPU_UTIL"]]
    assert labels and all("hpc_job" not in lb for lb in labels)


def test_an_injected_xid_reaches_prometheus_and_alertmanager(
    lab_cfg: LabConfig, submit: Callable[..., int], clean_faults: None
) -> None:
    job = submit(nodes=2)
    node = running_nodes(lab_cfg, job)[1]
    # The exporter maps GPUs to the job once it sees it running (as the HPC job mapping does
    # once the job's prolog has run); the fault comes after that.
    eventually(
        lambda: query(lab_cfg, f'DCGM_FI_DEV_GPU_UTIL{{hpc_job="{job}",Hostname="{node}"}}'),
        what="GPU mapped to the job",
    )
    manage.inject_gpu(lab_cfg, "xid", node, 3, xid=79)
    series = eventually(
        lambda: query(lab_cfg, "DCGM_FI_DEV_XID_ERRORS > 0"), what="XID in Prometheus"
    )
    assert len(series) == 1
    labels = series[0]["labels"]
    assert (labels["Hostname"], labels["gpu"], labels["hpc_job"]) == (node, "3", str(job))
    assert series[0]["value"] == 79
    alert = eventually(
        lambda: api.alerts(lab_cfg, alertname="GpuXidNodeFault", node=node),
        what="GpuXidNodeFault in Alertmanager",
    )[0]
    assert alert["labels"]["slurm_job_id"] == str(job)
    assert alert["labels"]["signal"] == "gpu_hw"
    assert alert["labels"]["xid"] == "79"


def test_gpu_faults_change_the_series_like_dcgm_would(
    lab_cfg: LabConfig, clean_faults: None
) -> None:
    node = "gpu08"
    manage.inject_gpu(lab_cfg, "gpu_lost", node, 5)
    manage.inject_gpu(lab_cfg, "nvlink", node, 1, rate=100)
    manage.inject_gpu(lab_cfg, "ecc_dbe", node, 2, count=3)
    first = dcgm(lab_cfg, node)
    gpus = {lb["gpu"] for lb, _ in first["DCGM_FI_DEV_GPU_TEMP"]}
    assert gpus == {"0", "1", "2", "3", "4", "6", "7"}  # GPU 5 fell off the bus

    def value(metrics: dict, name: str, gpu: str) -> float:  # type: ignore[type-arg]
        return next(v for lb, v in metrics[name] if lb["gpu"] == gpu)

    assert value(first, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "2") == 3
    assert value(first, "DCGM_FI_DEV_XID_ERRORS", "2") == 48
    nvlink = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    eventually(
        lambda: value(dcgm(lab_cfg, node), nvlink, "1") > value(first, nvlink, "1"),
        what="NVLink errors rising",
    )
    manage.clear(lab_cfg, node)
    after = dcgm(lab_cfg, node)
    assert len(after["DCGM_FI_DEV_GPU_TEMP"]) == 8
    assert value(after, "DCGM_FI_DEV_XID_ERRORS", "2") == 0


def test_slurm_exporter_agrees_with_sinfo_and_squeue(
    lab_cfg: LabConfig, submit: Callable[..., int]
) -> None:
    submit(nodes=3)
    submit(nodes=2, partition="debug")
    slurm(
        lab_cfg,
        "scontrol",
        "update",
        "nodename=gpu06",
        "state=drain",
        "reason=slurmedic: test 1.0 gpu_hardware",
    )
    try:
        eventually(
            lambda: slurm(lab_cfg, "squeue", "-h", "-p", "debug", "-o", "%t").strip() == "R",
            what="debug job running",
        )

        def agree() -> bool:
            m = scrape(f"{lab_cfg.url(lab_cfg.slurm_exporter_port)}/metrics")
            sinfo = dict(
                line.split()
                for line in slurm(lab_cfg, "sinfo", "-h", "-N", "-o", "%N %T").splitlines()
            )
            status = {lb["node"]: lb["status"] for lb, _ in m["slurm_node_status"]}
            running = len(slurm(lab_cfg, "squeue", "-h", "-t", "R", "-o", "%i").split())
            alloc_train = sum(
                1
                for n, s in sinfo.items()
                if s == "allocated" and lab_cfg.partition_of(n) == "train"
            )
            exported_alloc = {lb["partition"]: v for lb, v in m["slurm_nodes_alloc"]}
            reasons = {
                lb["node"]: lb["reason"] for lb, _ in m.get("slurm_node_drain_reason_info", [])
            }
            return (
                status == sinfo
                and m["slurm_jobs_running"][0][1] == running == 2
                and exported_alloc == {"train": alloc_train, "debug": 2}
                and reasons == {"gpu06": "slurmedic: test 1.0 gpu_hardware"}
                and {lb["partition"] for lb, _ in m["slurm_node_status"]} == {"train", "debug"}
            )

        eventually(agree, what="exporter == sinfo/squeue")
        # And Prometheus scraped it.
        drained = eventually(
            lambda: query(lab_cfg, 'slurm_node_status{status="drained"}'),
            what="drained node in Prometheus",
        )
        assert [s["labels"]["node"] for s in drained] == ["gpu06"]
    finally:
        slurm(lab_cfg, "scontrol", "update", "nodename=gpu06", "state=resume")


def test_a_killed_node_stops_responding_and_clear_brings_it_back(
    lab_cfg: LabConfig, clean_faults: None
) -> None:
    manage.kill_node(lab_cfg, "gpu07")
    eventually(
        lambda: query(lab_cfg, 'slurm_node_status{node="gpu07",status=~".*[*]"}'),
        timeout=40,
        what="gpu07 not responding in Prometheus",
    )
    manage.clear(lab_cfg, "gpu07")
    eventually(
        lambda: slurm(lab_cfg, "sinfo", "-h", "-n", "gpu07", "-o", "%t").strip() == "idle",
        timeout=40,
        what="gpu07 idle again",
    )
