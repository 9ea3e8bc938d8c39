"""What slurmedic keeps of a collect_diagnostics run: artifacts per incident and node, and a
health summary from the nvidia-smi XML, its NVLink counters and Slurm's count of the node's GPUs
(the lab's fake nvidia-smi renders the real H200 output, and `nvlink -e` in the real tool's
layout, with injected faults)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from lab.config import LabConfig
from lab.faults import GpuFault, add_gpu_fault
from lab.nvidia_smi import main, render, render_nvlink_errors
from webhook.cli.decisions import _print_diagnostics
from webhook.executor.diagnostics import keep
from webhook.executor.runner import RunResult


def _run(
    node: str,
    xml: str,
    error: str = "",
    rc: str = "0",
    nvlink: str | None = None,
    gres: str | None = None,
) -> RunResult:
    extra = {}
    if nvlink is not None:
        extra["nvlink_errors"] = {"rc": rc, "stdout": nvlink, "error": error}
    if gres is not None:
        line = f"NodeName={node} Arch=x86_64 Gres={gres} State=IDLE+DRAIN"
        extra["slurm_node"] = {"rc": "0", "stdout": line, "error": ""}
    return RunResult(
        "collect_diagnostics",
        False,
        "successful",
        0,
        diagnostics={
            node: {
                "node": node,
                **extra,
                "nvidia_smi": {"rc": rc, "stdout": xml, "error": error},
                "dmesg": {"rc": "1", "stdout": "", "error": "dmesg: Operation not permitted"},
                "slurmd_log": {"rc": "0", "stdout": "[2026-11-30T00:00:00] slurmd started"},
            }
        },
    )


def test_healthy_node_keeps_its_files(tmp_path: Path) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab")
    xml, errors = render(cfg, "gpu01")
    assert errors == []
    note = keep(_run("gpu01", xml), tmp_path / "art", "node:gpu01#2")
    node = note["nodes"]["gpu01"]
    assert node["verdict"] == "healthy"
    folder = Path(node["artifacts"])
    assert folder == tmp_path / "art" / "node_gpu01_2" / "gpu01"  # no ':' or '#' in paths
    assert (folder / "nvidia-smi.xml").read_text() == xml
    assert (folder / "slurmd.log").read_text().startswith("[2026")
    assert not (folder / "dmesg.txt").exists()
    assert "dmesg" in node["missing"]
    assert "healthy" in (folder / "summary.txt").read_text().splitlines()[0]


def test_double_bit_ecc_and_a_gpu_off_the_bus(tmp_path: Path) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab")
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu03", gpu=2, kind="ecc_dbe", at=0, count=3))
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu03", gpu=5, kind="xid", xid=79, at=0))
    xml, errors = render(cfg, "gpu03")
    assert len(errors) == 1 and "Unknown Error" in errors[0]
    # nvidia-smi exits non-zero when a GPU is lost, with the other GPUs' XML: still read.
    run = _run("gpu03", xml, errors[0], rc="15")
    node = keep(run, tmp_path / "art", "41.0")["nodes"]["gpu03"]
    assert node["verdict"] == "unhealthy"
    assert any(p.startswith("nvidia-smi exited rc 15") for p in node["problems"])
    assert any("double-bit" in p and p.startswith("GPU 2 ") for p in node["problems"])
    assert "nvidia-smi shows 7 of 8 GPUs" in node["problems"]
    assert node["summary"][0].startswith("node: unhealthy")
    assert any("Unknown Error" in line for line in node["summary"])


def test_a_node_that_only_went_off_the_bus_is_unhealthy(tmp_path: Path) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab")
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu04", gpu=0, kind="gpu_lost", at=0))
    xml, _ = render(cfg, "gpu04")
    node = keep(_run("gpu04", xml), tmp_path / "art", "7.1")["nodes"]["gpu04"]
    assert node["verdict"] == "unhealthy"
    assert node["problems"] == [
        "nvidia-smi shows 7 of 8 GPUs",
        "GPU 0: missing from nvidia-smi's listing",  # no stderr given: its address unknown
    ]


def test_xid_79_on_gpu_3_leaves_gpu_4_named_gpu_4(tmp_path: Path) -> None:
    """The operator's case: GPU 3 fell off the bus; the GPU listed fourth is GPU 4 (its minor
    number, dcgm-exporter's `gpu` label), and GPU 3 is reported missing with its address."""
    cfg = LabConfig(run_dir=tmp_path / "lab")
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu02", gpu=3, kind="xid", xid=79, at=0))
    xml, errors = render(cfg, "gpu02", now=60)
    nvlink, _ = render_nvlink_errors(cfg, "gpu02", now=60)
    run = _run("gpu02", xml, "\n".join(errors), "15", nvlink, "gpu:h200:8(S:0-1)")
    node = keep(run, tmp_path / "art", "12.0")["nodes"]["gpu02"]
    assert node["verdict"] == "unhealthy"
    assert node["missing_gpus"] == [{"minor_number": 3, "pci_bus_id": "00000000:48:00.0"}]
    assert node["problems"][:2] == [
        "nvidia-smi shows 7 of 8 GPUs",
        "GPU 3 (00000000:48:00.0): missing from nvidia-smi's listing",
    ]
    assert "GPU 4 (00000000:58:00.0): healthy, 35 C, 125 W" in node["summary"]
    assert not [ln for ln in node["summary"] if ln.startswith("GPU 3 ") and "healthy" in ln]
    folder = Path(node["artifacts"])
    assert (folder / "nvidia-smi-nvlink-e.txt").read_text() == nvlink
    assert "Gres=gpu:h200:8" in (folder / "scontrol-show-node.txt").read_text()


def test_slurms_gres_counts_a_gpu_the_driver_no_longer_does(tmp_path: Path) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab")
    xml, _ = render(cfg, "gpu03", now=0)
    # Nine in Slurm's gres, eight in the listing and in the driver's count.
    node = keep(_run("gpu03", xml, gres="gpu:h200:9"), tmp_path / "art", "3.0")["nodes"]["gpu03"]
    assert node["verdict"] == "unhealthy"
    assert node["problems"] == [
        "nvidia-smi shows 8 of 9 GPUs",
        "GPU 8: missing from nvidia-smi's listing",
    ]


def test_an_injected_nvlink_fault_shows_in_the_nvlink_counters(tmp_path: Path) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab")
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu05", gpu=6, kind="nvlink", at=100, rate=50))
    xml, _ = render(cfg, "gpu05", now=110)
    nvlink, errors = render_nvlink_errors(cfg, "gpu05", now=110)
    assert errors == []
    node = keep(_run("gpu05", xml, nvlink=nvlink, gres="gpu:8"), tmp_path / "art", "5.0")
    found = node["nodes"]["gpu05"]
    assert found["verdict"] == "unhealthy"
    # The fake dcgm-exporter's counts at that moment: 50/s for 10 s, a replay per 4 CRC errors.
    assert found["problems"] == [
        "GPU 6 (00000000:78:00.0): NVLink errors: link 0 CRC Errors 500, Replay Errors 125."
    ]


def test_an_injected_pcie_fault_shows_in_the_replay_counter(tmp_path: Path) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab")
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu06", gpu=1, kind="pcie", at=100, rate=100))
    xml, _ = render(cfg, "gpu06", now=115)
    nvlink, _ = render_nvlink_errors(cfg, "gpu06", now=115)
    node = keep(_run("gpu06", xml, nvlink=nvlink, gres="gpu:8"), tmp_path / "art", "6.0")
    assert node["nodes"]["gpu06"]["problems"] == [
        "GPU 1 (00000000:28:00.0): 1501 PCIe replays since reset (threshold 100)."
    ]
    # Before the fault: the real H200's one replay, healthy.
    xml, _ = render(cfg, "gpu06", now=50)
    assert keep(_run("gpu06", xml), tmp_path / "a2", "6.0")["nodes"]["gpu06"]["verdict"] == (
        "healthy"
    )


def test_the_fake_nvidia_smi_answers_nvlink_e_as_a_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab")
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu01", gpu=0, kind="gpu_lost", at=0))
    args = [f"--lab-dir={cfg.run_dir}", "--node=gpu01"]
    assert main([*args, "nvlink", "-e"]) == 15  # a GPU lost, as nvidia-smi exits
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("GPU 0: NVIDIA H200 (UUID: GPU-")
    assert out.count("\t Link 17: CRC Errors: 0\n") == 7
    assert "Unable to determine the device handle for GPU00000000:18:00.0" in err
    assert main([*args, "-q", "-x"]) == 15
    assert capsys.readouterr().out.count("<minor_number>") == 7


def test_no_nvidia_smi_and_unreachable_nodes_are_recorded_not_guessed(tmp_path: Path) -> None:
    run = _run("gpu05", "", "Error executing command.", rc="2")
    run.unreachable.append("gpu06")
    nodes = keep(run, tmp_path / "art", "9.0")["nodes"]
    assert nodes["gpu05"]["verdict"] == "unknown"
    assert nodes["gpu05"]["missing"]["nvidia_smi"] == "rc 2: Error executing command."
    assert nodes["gpu06"] == {"verdict": "unknown", "unreachable": True}


def test_output_that_is_not_nvidia_smi_is_unknown(tmp_path: Path) -> None:
    node = keep(_run("gpu07", "<html>nope</html>"), tmp_path / "art", "9.0")["nodes"]["gpu07"]
    assert node["verdict"] == "unknown"
    assert "not understood" in node["summary"][0]


def test_decisions_show_prints_every_problem_of_an_eight_gpu_node(tmp_path: Path) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab")
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu02", gpu=3, kind="xid", xid=79, at=0))
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu02", gpu=7, kind="pcie", at=0, rate=100))
    xml, errors = render(cfg, "gpu02", now=60)
    note = keep(_run("gpu02", xml, "\n".join(errors), "15"), tmp_path / "art", "12.0")
    problems = note["nodes"]["gpu02"]["problems"]
    assert len(problems) == 4 and len(note["nodes"]["gpu02"]["summary"]) > 12
    console = Console(record=True, width=200)
    _print_diagnostics(console, note)
    printed = console.export_text()
    assert all(p in printed for p in problems[:3]), printed
    assert problems[3].startswith("nvidia-smi exited rc 15: Unable to determine")
    assert "nvidia-smi: Unable to determine the device handle for GPU00000000:48:00.0" in printed
