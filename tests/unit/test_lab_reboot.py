"""The lab's repairs: what a reboot and a GPU reset clear, the fake `nvidia-smi -r`, and the
RebootProgram slurm.conf names (lab/faults.py, lab/nvidia_smi.py, lab/reboot.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.config import LabConfig
from lab.faults import (
    GpuFault,
    NodeFault,
    add_gpu_fault,
    add_node_fault,
    clear_gpu_faults,
    load_gpu_faults,
    repair_gpu_faults,
    survives,
)
from lab.nvidia_smi import LOST, OTHER_ERROR, main, reset
from lab.reboot import slurmd_of
from lab.slurm import RESUME_TIMEOUT, reboot_program, render_reboot_program, render_slurm_conf

ALL = [
    GpuFault(node="gpu02", gpu=0, kind="xid", xid=48, at=0),
    GpuFault(node="gpu02", gpu=1, kind="xid", xid=79, at=0),
    GpuFault(node="gpu02", gpu=2, kind="ecc_dbe", at=0),
    GpuFault(node="gpu02", gpu=3, kind="row_remap_failure", at=0),
    GpuFault(node="gpu02", gpu=4, kind="nvlink", at=0),
    GpuFault(node="gpu02", gpu=5, kind="thermal", at=0),
    GpuFault(node="gpu02", gpu=6, kind="pcie", at=0),
    GpuFault(node="gpu02", gpu=7, kind="gpu_lost", at=0),
]


@pytest.fixture
def cfg(tmp_path: Path) -> LabConfig:
    return LabConfig(run_dir=tmp_path / "lab")


def _kinds(faults: list[GpuFault]) -> list[tuple[int, str]]:
    return sorted((f.gpu, f.kind) for f in faults)


def test_a_reboot_clears_everything_but_a_failed_row_remap() -> None:
    assert [f.gpu for f in ALL if survives(f, "reboot")] == [3]


def test_a_reset_also_leaves_a_gpu_off_the_bus() -> None:
    assert [f.gpu for f in ALL if survives(f, "reset")] == [1, 3, 7]


def test_repair_removes_only_what_it_clears_on_its_node_and_gpus(cfg: LabConfig) -> None:
    for f in ALL:
        add_gpu_fault(cfg.faults_file, f)
    other = GpuFault(node="gpu03", gpu=0, kind="xid", xid=48, at=0)
    add_gpu_fault(cfg.faults_file, other)
    gone = repair_gpu_faults(cfg.faults_file, "gpu02", "reset", frozenset({0, 1, 2}))
    assert _kinds(gone) == [(0, "xid"), (2, "ecc_dbe")]
    gone = repair_gpu_faults(cfg.faults_file, "gpu02", "reboot")
    assert _kinds(gone) == [(1, "xid"), (4, "nvlink"), (5, "thermal"), (6, "pcie"), (7, "gpu_lost")]
    left = load_gpu_faults(cfg.faults_file).faults
    assert _kinds(left) == [(0, "xid"), (3, "row_remap_failure")]
    assert {f.node for f in left} == {"gpu02", "gpu03"}


def test_clear_removes_node_faults_with_the_gpu_faults(cfg: LabConfig) -> None:
    add_node_fault(cfg.faults_file, NodeFault(node="gpu02", kind="diag_fail", at=0))
    add_node_fault(cfg.faults_file, NodeFault(node="gpu04", kind="reboot_hang", at=0))
    add_gpu_fault(cfg.faults_file, ALL[0])
    assert load_gpu_faults(cfg.faults_file).of_node("gpu02") == ([ALL[0]], {"diag_fail"})
    assert clear_gpu_faults(cfg.faults_file, "gpu02") == 1
    state = load_gpu_faults(cfg.faults_file)
    assert state.of_node("gpu02") == ([], set())
    assert state.of_node("gpu04") == ([], {"reboot_hang"})


def _present(*minors: int) -> list[tuple[int, list[GpuFault]]]:
    return [(m, []) for m in minors]


def test_reset_resets_every_gpu_it_sees() -> None:
    out, errors, code, done = reset(_present(0, 1), [], None, busy=False)
    assert out == (
        "GPU 00000000:18:00.0 was successfully reset.\n"
        "GPU 00000000:28:00.0 was successfully reset.\n"
        "All done.\n"
    )
    assert (errors, code, done) == ([], 0, frozenset({0, 1}))


def test_reset_of_one_gpu_by_index_skips_the_lost_ones() -> None:
    # GPU 1 is off the bus: index 1 of the listing is minor 2.
    out, errors, code, done = reset(_present(0, 2), ["lost GPU1"], 1, busy=False)
    assert out.startswith("GPU 00000000:38:00.0 was successfully reset.\n")
    assert (errors, code, done) == ([], 0, frozenset({2}))


def test_reset_with_a_gpu_off_the_bus_fails_with_its_error() -> None:
    _, errors, code, done = reset(_present(0), ["lost GPU1"], None, busy=False)
    assert (errors, code, done) == (["lost GPU1"], LOST, frozenset({0}))


def test_reset_of_an_unknown_index_fails() -> None:
    out, errors, code, done = reset(_present(0, 1), [], 5, busy=False)
    assert (out, code, done) == ("", 6, frozenset())
    assert errors == ["No GPU found with index 5"]


def test_reset_refuses_while_the_gpus_are_in_use() -> None:
    out, _, code, done = reset(_present(0, 1), [], None, busy=True)
    assert out.startswith("GPU 00000000:18:00.0 is currently in use by another process.\n")
    assert "2 devices are currently being used" in out
    assert (code, done) == (OTHER_ERROR, frozenset())
    out, _, _, _ = reset(_present(0, 1), [], 0, busy=True)
    assert "1 device is currently being used" in out and "this device and" in out


def test_nvidia_smi_r_clears_what_a_reset_clears(
    cfg: LabConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for f in ALL:
        add_gpu_fault(cfg.faults_file, f)
    monkeypatch.setattr("lab.nvidia_smi.node_busy", lambda _cfg, _node: False)
    assert main(["--lab-dir", str(cfg.run_dir), "--node", "gpu02", "-r"]) == LOST
    out, err = capsys.readouterr()
    assert out.count("was successfully reset.") == 6 and out.endswith("All done.\n")
    assert err.count("Unable to determine the device handle") == 2
    left = load_gpu_faults(cfg.faults_file).faults
    assert _kinds(left) == [(1, "xid"), (3, "row_remap_failure"), (7, "gpu_lost")]


def test_slurm_conf_names_the_reboot_program(cfg: LabConfig) -> None:
    conf = render_slurm_conf(cfg).splitlines()
    assert f"RebootProgram={reboot_program(cfg)}" in conf
    assert f"ResumeTimeout={RESUME_TIMEOUT}" in conf
    script = render_reboot_program(cfg)
    assert script.startswith("#!/bin/sh\n")
    assert f"-m lab.reboot --lab-dir={cfg.run_dir}" in script


def test_the_reboot_program_finds_its_slurmd_among_its_ancestors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = {30: 20, 20: 10, 10: 1}
    argv = {
        30: ["python"],
        20: ["/bin/sh", "-c", "x"],
        10: ["/usr/sbin/slurmd", "-b", "-D", "-N", "gpu05"],
    }
    monkeypatch.setattr("lab.reboot.cmdline", lambda pid: argv.get(pid, []))
    monkeypatch.setattr("lab.processes.parent_of", lambda pid: tree.get(pid))
    assert slurmd_of(30) == (10, "gpu05")
    argv[10] = ["/usr/sbin/slurmctld", "-D"]
    assert slurmd_of(30) is None
