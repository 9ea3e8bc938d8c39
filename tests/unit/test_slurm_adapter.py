"""The Slurm adapter reads what each release really prints (captured from the lab's stacks by
tests/data/slurm/capture.py): 22.05's sinfo/squeue JSON, 24.11's and 26.05's scontrol JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from webhook.adapters import slurm as slurm_adapter
from webhook.adapters.slurm import (
    Release,
    SlurmCluster,
    SlurmError,
    exit_code,
    job_state,
    node_state,
    number,
    parse_topology,
    read_jobs,
    read_nodes,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"
RELEASES = sorted(p.name for p in DATA.iterdir() if p.is_dir())


def test_every_supported_release_is_captured() -> None:
    assert [r.split(".")[0] for r in RELEASES] == ["22", "24", "26"]


def fake_slurm(tmp_path: Path, release: str) -> dict[str, str]:
    """Slurm's commands answering with what `release` printed (the adapter picks which)."""
    src = DATA / release
    bindir = tmp_path / "bin"
    bindir.mkdir()
    answers = {
        "sinfo --json": "sinfo.json",
        "squeue --json --states=all": "squeue.json",
        "scontrol --version": "version.txt",
        "scontrol show topology": "topology.txt",
        "scontrol show nodes --json": "nodes.json",
        "scontrol show jobs --json": "jobs.json",
    }
    log = tmp_path / "calls.log"
    for cmd in ("sinfo", "squeue", "scontrol"):
        cases = "\n".join(
            f'  "{argv}") exec cat {src / file} ;;'
            for argv, file in answers.items()
            if argv.split()[0] == cmd and (src / file).exists()
        )
        script = (
            f'#!/bin/sh\necho "{cmd} $*" >> {log}\ncase "{cmd} $*" in\n{cases}\n'
            '  *) echo "unknown: $*" >&2; exit 1 ;;\nesac\n'
        )
        (bindir / cmd).write_text(script)
        (bindir / cmd).chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("release", RELEASES)
def test_view_of_each_release(tmp_path: Path, release: str) -> None:
    made = json.loads((DATA / release / "made.json").read_text())
    snap = SlurmCluster(env=fake_slurm(tmp_path, release)).snapshot()
    assert str(snap.release) == release
    calls = (tmp_path / "calls.log").read_text()
    if snap.release.scontrol_json:
        assert "scontrol show nodes --json" in calls and "sinfo" not in calls
    else:
        assert "sinfo --json" in calls and "squeue --json --states=all" in calls
    view = snap.view()

    assert len(view.nodes) == 8
    drained, down = view.nodes[made["drained"]], view.nodes[made["down"]]
    assert (drained.state, drained.reason) == ("drain", "xid 79 on GPU 3")
    assert down.state == "down"
    assert view.nodes["gpu07"].partitions == ("debug",)
    # Leaf switches only: 24.11 and later list the spine's nodes too.
    assert view.switches == {
        "leaf1": ("gpu01", "gpu02", "gpu03", "gpu04"),
        "leaf2": ("gpu05", "gpu06", "gpu07", "gpu08"),
    }
    assert drained.switch == "leaf1"

    running = view.jobs[made["running"]]
    assert running.state == "RUNNING"
    assert len(running.nodes) == 2 and running.restarts == 0 and running.requeue
    assert running.options() == {"max_requeues": 2}
    assert running.started is not None and running.ended is None  # end_time = its time limit
    assert view.jobs_on(running.nodes[0]) == [running]

    held = view.jobs[made["requeue_held"]]
    assert (held.state, held.restarts, held.nodes) == ("PENDING", 1, ())

    cancelled = view.jobs[made["cancelled"]]
    assert cancelled.state == "CANCELLED" and cancelled.partition == "debug"
    assert cancelled.ended is not None and cancelled.started is not None
    assert cancelled.ended >= cancelled.started

    pending = view.jobs[made["pending"]]
    assert (pending.state, pending.restarts, pending.started) == ("PENDING", 0, None)


@pytest.mark.parametrize("release", RELEASES)
def test_a_job_s_exclusions_are_read_expanded(release: str) -> None:
    """Its ExcNodeList as each release prints it (a hostlist string; empty when none)."""
    data = json.loads(
        (DATA / release / ("squeue.json" if release < "23" else "jobs.json")).read_text()
    )
    record = data["jobs"][0]
    assert record["excluded_nodes"] == ""  # the captures' jobs excluded nothing
    (job,) = read_jobs({**data, "jobs": [record]}, Release.parse(release), ("squeue",))
    assert job.excluded == frozenset()
    record = {**record, "excluded_nodes": "gpu[05-06],gpu08"}
    (job,) = read_jobs({**data, "jobs": [record]}, Release.parse(release), ("squeue",))
    assert job.excluded == {"gpu05", "gpu06", "gpu08"}
    record = {**record, "excluded_nodes": "gpu[05-"}
    with pytest.raises(SlurmError, match=r"job .*: not a host list: 'gpu\[05-'"):
        read_jobs({**data, "jobs": [record]}, Release.parse(release), ("squeue",))


@pytest.mark.parametrize("release", RELEASES)
def test_a_job_s_owner_is_read_on_every_release(release: str) -> None:
    """User, account and partition, as each release prints them: the notices' owner labels.
    The lab's Slurm names no account (empty), a site's with accounting does."""
    data = json.loads(
        (DATA / release / ("squeue.json" if release < "23" else "jobs.json")).read_text()
    )
    record = data["jobs"][0]
    assert {"user_name", "account", "partition"} <= record.keys()
    (job,) = read_jobs({**data, "jobs": [record]}, Release.parse(release), ("squeue",))
    assert (job.user, job.account, job.partition) == ("root", "", "train")
    record = {**record, "user_name": "alice", "account": "vision"}
    (job,) = read_jobs({**data, "jobs": [record]}, Release.parse(release), ("squeue",))
    assert (job.user, job.account) == ("alice", "vision")


@pytest.mark.parametrize(
    ("raw", "flags", "base", "rest"),
    [
        ("idle", ["DRAIN"], "IDLE", {"DRAIN"}),  # 22.05
        (["IDLE", "DRAIN"], None, "IDLE", {"DRAIN"}),  # 23.02+
        (["DOWN", "DRAIN", "NOT_RESPONDING"], None, "DOWN", {"DRAIN", "NOT_RESPONDING"}),
        (["MIXED", "COMPLETING"], None, "MIXED", {"COMPLETING"}),
        ([], None, "UNKNOWN", set()),
    ],
)
def test_node_state_shapes(raw: Any, flags: Any, base: str, rest: set[str]) -> None:
    assert node_state(raw, flags) == (base, frozenset(rest))


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("RUNNING", ("RUNNING", "")),
        ("COMPLETING", ("COMPLETING", "")),  # 22.05: the base is not printed
        (["RUNNING"], ("RUNNING", "")),
        (["RUNNING", "COMPLETING"], ("COMPLETING", "RUNNING")),
        (["CANCELLED", "COMPLETING"], ("COMPLETING", "CANCELLED")),
        (["PENDING", "REQUEUE_HOLD"], ("REQUEUE_HOLD", "PENDING")),
        (["COMPLETED", "REQUEUED", "COMPLETING"], ("COMPLETING", "COMPLETED")),  # Slurm's order
        (["NODE_FAIL"], ("NODE_FAIL", "")),
    ],
)
def test_job_state_as_slurm_spells_it(raw: Any, want: tuple[str, str]) -> None:
    assert job_state(raw) == want


def test_a_job_completing_after_scancel_is_ended_on_purpose_and_ended() -> None:
    (job,) = read_jobs(
        {"jobs": [{"job_id": 7, "job_state": ["CANCELLED", "COMPLETING"],
                   "end_time": {"set": True, "infinite": False, "number": 1796109769}}]},
        Release(24, 11, 5), ("scontrol",),
    )  # fmt: skip
    assert (job.state, job.base, job.ended_on_purpose) == ("COMPLETING", "CANCELLED", True)
    assert job.ended is not None


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (1796109769, 1796109769),
        ({"set": True, "infinite": False, "number": 1796109769}, 1796109769),
        ({"set": False, "infinite": False, "number": 0}, None),
        ({"set": True, "infinite": True, "number": 0}, None),
        (None, None),
        ("12", 12),
    ],
)
def test_numbers_of_both_shapes(raw: Any, want: int | None) -> None:
    assert number(raw) == want


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (93 << 8, 93),  # 22.05: the raw wait status
        (0, 0),
        (15, None),  # 22.05: ended by signal 15
        ((1 << 8) | 0x80 | 11, None),  # a core dump of a SIGSEGV
        ({"status": ["ERROR"], "return_code": {"set": True, "infinite": False, "number": 93},
          "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""}}, 93),
        ({"status": ["SIGNALED"], "return_code": {"set": False, "infinite": False, "number": 0},
          "signal": {"id": {"set": True, "infinite": False, "number": 15}, "name": "TERM"}}, None),
        (None, None),
    ],
)  # fmt: skip
def test_exit_codes_of_both_shapes(raw: Any, want: int | None) -> None:
    assert exit_code(raw) == want


@pytest.mark.parametrize("release", RELEASES)
def test_only_an_ended_job_has_an_exit_code(release: str) -> None:
    """squeue prints an exit code (0) for a running job too: it is no job's word until the job
    has ended."""
    data = json.loads(
        (DATA / release / ("squeue.json" if release < "23" else "jobs.json")).read_text()
    )
    record = data["jobs"][0]
    (job,) = read_jobs({**data, "jobs": [record]}, Release.parse(release), ("squeue",))
    assert job.state == "RUNNING" and job.exit_code is None
    code = 93 << 8 if release < "23" else {"status": ["ERROR"], "return_code": 93}
    state = "FAILED" if release < "23" else ["FAILED"]
    record = {**record, "job_state": state, "exit_code": code}
    (job,) = read_jobs({**data, "jobs": [record]}, Release.parse(release), ("squeue",))
    assert (job.state, job.exit_code) == ("FAILED", 93)
    # Requeued and held by Slurm after that run (an expedited requeue): its code is kept.
    state = "REQUEUE_HOLD" if release < "23" else ["PENDING", "REQUEUE_HOLD"]
    record = {**record, "job_state": state}
    (job,) = read_jobs({**data, "jobs": [record]}, Release.parse(release), ("squeue",))
    assert (job.state, job.held, job.waiting, job.exit_code) == ("REQUEUE_HOLD", True, True, 93)


def test_grouped_sinfo_is_a_clear_error() -> None:
    """24.11's `sinfo --json` has no `nodes`: one error naming command and release."""
    data = json.loads((DATA / "24.11.5" / "sinfo.json").read_text())
    with pytest.raises(SlurmError) as e:
        read_nodes(data, Release(24, 11, 5), ("sinfo", "--json"))
    msg = str(e.value)
    assert "`sinfo --json` of Slurm 24.11.5" in msg and "'nodes'" in msg and "sinfo" in msg


@pytest.mark.parametrize(
    "bad",
    [
        {"jobs": [{"job_id": 1, "job_state": {"odd": 1}}]},
        {"jobs": [{"job_state": ["RUNNING"]}]},
        {"jobs": [{"job_id": 1, "job_state": ["RUNNING"], "start_time": [1]}]},
        {"jobs": {"1": {}}},
    ],
)
def test_unreadable_jobs_name_command_and_release(bad: dict[str, Any]) -> None:
    with pytest.raises(SlurmError, match=r"`scontrol show jobs --json` of Slurm 26\.05\.5"):
        read_jobs(bad, Release(26, 5, 5), ("scontrol", "show", "jobs", "--json"))


def test_errors_slurm_reports_in_its_json(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  "--version") echo "slurm 25.05.3" ;;\n'
        '  *) echo \'{"nodes": [], "errors": [{"description": "Unable to contact slurm '
        'controller", "error_number": 1}]}\' ;;\nesac\n'
    )
    (bindir / "scontrol").chmod(0o755)
    cluster = SlurmCluster(env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    with pytest.raises(SlurmError, match=r"of Slurm 25\.05\.3: Unable to contact slurm"):
        cluster.snapshot()


def test_release_parsing() -> None:
    assert Release.parse("slurm-wlm 24.11.5\n") == Release(24, 11, 5)
    assert Release.parse("slurm 22.05.8") < Release(23, 2) <= Release.parse("slurm 23.02.0")
    with pytest.raises(SlurmError, match="no Slurm release"):
        Release.parse("command not found")


def test_the_topology_is_read_again_once_a_minute_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop reads the cluster every few seconds; the topology changes only on a
    reconfigure: one `scontrol show topology` per TOPOLOGY_S, nodes and jobs every time."""
    clock = [1000.0]
    monkeypatch.setattr(slurm_adapter.time, "monotonic", lambda: clock[0])
    cluster = SlurmCluster(env=fake_slurm(tmp_path, RELEASES[-1]))
    first = cluster.snapshot()
    clock[0] += slurm_adapter.TOPOLOGY_S - 1
    assert cluster.snapshot().switches == first.switches != {}
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls.count("scontrol show topology") == 1
    assert calls.count("scontrol show jobs --json") == 2
    clock[0] += 1
    cluster.snapshot()
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls.count("scontrol show topology") == 2


def test_topology_leaves() -> None:
    text = (
        "SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]\n"
        "SwitchName=top Level=1 LinkSpeed=1 Nodes=n[1-2] Switches=s1\n"
    )
    assert parse_topology(text) == {"s1": ("n1", "n2")}
