"""Bad input to `slurmedic lab` is a one-line error naming what is wrong; nothing is written."""

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.faults import load_gpu_faults
from webhook.cli import main


@pytest.fixture
def run(tmp_path: Path):  # type: ignore[no-untyped-def]
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str]:
        result = runner.invoke(main, ["lab", "--run-dir", str(tmp_path), *args])
        return result.exit_code, result.output

    return invoke


def test_unknown_node_is_refused(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, out = run("inject", "xid", "gpu99", "--code", "79")
    assert code == 1
    assert "node: 'gpu99' is not a lab node" in out
    assert load_gpu_faults(tmp_path / "dcgm" / "faults.json").faults == []


def test_out_of_range_xid_names_the_option(run) -> None:  # type: ignore[no-untyped-def]
    code, out = run("inject", "xid", "gpu01", "--code", "0")
    assert code == 2
    assert "--code" in out


def test_gpu_index_is_checked(run) -> None:  # type: ignore[no-untyped-def]
    code, out = run("inject", "thermal", "gpu01", "--gpu", "8")
    assert code == 1
    assert "gpu: 8 is not in 0..7" in out


def test_a_valid_gpu_fault_is_recorded(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, out = run("inject", "xid", "gpu03", "--gpu", "2", "--code", "79")
    assert code == 0, out
    faults = load_gpu_faults(tmp_path / "dcgm" / "faults.json").faults
    assert [(f.node, f.gpu, f.kind, f.xid) for f in faults] == [("gpu03", 2, "xid", 79)]
    code, out = run("clear", "gpu03")
    assert code == 0 and "cleared 1" in out


def test_clear_of_unknown_node(run) -> None:  # type: ignore[no-untyped-def]
    code, out = run("clear", "node1")
    assert code == 1 and "node: 'node1'" in out


def test_lab_down_spares_the_caller_s_own_pipeline(tmp_path: Path) -> None:
    """`slurmedic lab down | tail`: tail carries the lab's marker (the shell exported it) but is
    the caller's, in its process group; a lab process runs in a session of its own."""
    import os
    import subprocess

    from lab.config import MARKER_ENV, LabConfig
    from lab.processes import marked_pids

    cfg = LabConfig(run_dir=tmp_path)
    env = {**os.environ, MARKER_ENV: str(tmp_path)}
    argv = ["sleep", "60"]
    mine = subprocess.Popen(argv, env=env)
    lab_s = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        # Looked for until the lab's process shows up, as `lab down` looks for what is left (a
        # loaded machine was seen to show none of it in the first look); then never the
        # caller's own.
        deadline = time.monotonic() + 10
        while lab_s.pid not in (found := set(marked_pids(cfg))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lab_s.pid in found and mine.pid not in found
    finally:
        for p in (mine, lab_s):
            p.kill()
            p.wait()
