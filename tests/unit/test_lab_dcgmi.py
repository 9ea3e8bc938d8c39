"""The lab's `dcgmi diag -r 2` (lab/dcgmi.py): which test each fault left on a node fails, the
real tool's table layout, and its exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.config import LabConfig
from lab.dcgmi import NVVS_ERROR, diagnose, main, render
from lab.faults import GpuFault, NodeFault, add_gpu_fault, add_node_fault
from lab.monitoring import inventory

GPUS = 8


def _fault(kind: str, gpu: int = 3, xid: int | None = None) -> GpuFault:
    return GpuFault(node="gpu02", gpu=gpu, kind=kind, at=0, xid=xid)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fault", "tests"),
    [
        (_fault("ecc_dbe"), ["GPU Memory"]),
        (_fault("xid", xid=48), ["GPU Memory"]),
        (_fault("row_remap_failure"), ["GPU Memory", "Page Retirement/Row Remap"]),
        (_fault("pcie"), ["PCIe"]),
        (_fault("nvlink"), ["PCIe"]),
        (_fault("thermal"), ["Diagnostic"]),
        (_fault("xid", xid=13), ["Diagnostic"]),
        (_fault("xid", xid=79), ["Diagnostic", "GPU Memory", "PCIe"]),
        (_fault("gpu_lost"), ["Diagnostic", "GPU Memory", "PCIe"]),
    ],
)
def test_each_fault_fails_its_tests_on_its_gpu(fault: GpuFault, tests: list[str]) -> None:
    failed = diagnose([fault], set(), GPUS)
    assert sorted(failed) == tests
    assert all(list(gpus) == [3] and gpus[3].startswith("GPU 3 ") for gpus in failed.values())


def test_a_clean_node_passes_and_diag_fail_fails_it() -> None:
    assert diagnose([], set(), GPUS) == {}
    assert diagnose([], {"reboot_hang"}, GPUS) == {}
    assert list(diagnose([], {"diag_fail"}, GPUS)) == ["Diagnostic"]


def test_the_table_of_a_healthy_node() -> None:
    lines = render({}, GPUS).splitlines()
    assert lines[0] == "Successfully ran diagnostic for group."
    rule = "+---------------------------+------------------------------------------------+"
    assert lines[1] == rule and lines[-1] == rule
    assert (
        lines[2] == "| Diagnostic                | Result                                         |"
    )
    assert lines[3] == rule.replace("-", "=")
    assert "|-----  Metadata  ----------+------------------------------------------------|" in lines
    assert "+-----  Integration  -------+------------------------------------------------+" in lines
    assert "| GPU Device IDs Detected   | 2335,2335,2335,2335,2335,2335,2335,2335        |" in lines
    assert "| PCIe                      | Pass - All                                     |" in lines
    assert "| GPU Memory                | Pass - All                                     |" in lines
    assert not any("Diagnostic  " in line and "Pass" in line for line in lines)  # skipped
    assert {len(line) for line in lines[1:]} == {len(rule)}


def test_the_table_names_the_failing_gpu_and_wraps_its_warning() -> None:
    text = render(diagnose([_fault("row_remap_failure", gpu=2)], set(), GPUS), GPUS)
    lines = text.splitlines()
    i = lines.index(
        "| GPU Memory                | Pass - GPUs: 0, 1, 3, 4, 5, 6, 7               |"
    )
    assert (
        lines[i + 1]
        == "|                           | Fail - GPU: 2                                  |"
    )
    assert lines[i + 2].startswith("| Warning                   | GPU 2 had uncorrectable")
    assert lines[i + 3].startswith("|                           | ")
    assert "| Page Retirement/Row Remap | Fail                                           |" in lines
    assert {len(line) for line in lines[1:]} == {len(lines[1])}


def test_exit_codes_and_the_inventory_argv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = LabConfig(run_dir=tmp_path / "lab")
    argv = inventory(cfg)["all"]["children"]["slurm_nodes"]["hosts"]["gpu02"][
        "slurmedic_health_check"
    ]
    assert argv[:3] == [cfg.python, "-m", "lab.dcgmi"] and argv[-3:] == ["diag", "-r", "2"]
    assert main(argv[3:]) == 0
    assert "Fail" not in capsys.readouterr().out
    add_gpu_fault(cfg.faults_file, _fault("pcie", gpu=6))
    assert main(argv[3:]) == NVVS_ERROR == 226
    assert (
        "| PCIe                      | Pass - GPUs: 0, 1, 2, 3, 4, 5, 7" in capsys.readouterr().out
    )
    add_node_fault(cfg.faults_file, NodeFault(node="gpu03", kind="diag_fail", at=0))
    gpu03 = [a.replace("gpu02", "gpu03") for a in argv[3:]]
    assert main(gpu03) == NVVS_ERROR
    assert "Fail - GPU: 0" in capsys.readouterr().out
