"""What slurmedic keeps of a collect_diagnostics run: artifacts per incident and node, and a
health summary from the nvidia-smi XML (the lab's fake nvidia-smi renders the real H200 output
with injected faults)."""

from __future__ import annotations

from pathlib import Path

from lab.config import LabConfig
from lab.faults import GpuFault, add_gpu_fault
from lab.nvidia_smi import render
from webhook.executor.diagnostics import keep
from webhook.executor.runner import RunResult


def _run(node: str, xml: str, error: str = "", rc: str = "0") -> RunResult:
    return RunResult(
        "collect_diagnostics",
        False,
        "successful",
        0,
        diagnostics={
            node: {
                "node": node,
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
    assert node["problems"] == ["nvidia-smi shows 7 of 8 GPUs"]


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
