"""What slurmedic records of a playbook run comes from the playbook's `set_stats`, not from its
tasks' names: real ansible-runner, in check mode, on localhost, against a stand-in `scontrol`
(as Slurm answers) that logs its calls. Also: the playbooks' own request checks use the core's
node-name pattern (one file, playbooks/vars/slurmedic.yml), as a second line of defence."""

from __future__ import annotations

import shutil
from pathlib import Path

import ansible_runner
import pytest
import yaml

from tests.service.conftest import stand_in
from webhook.core.cluster import NODE_NAME
from webhook.core.patterns import playbook_vars_file
from webhook.executor.runner import PLAYBOOKS, RunResult, run_playbook

SCONTROL = """#!/bin/sh
echo "$@" >> "{log}"
case "$1 $2" in
  "show node") echo "NodeName=$3 State=ALLOCATED Reason=(null)";;
  "show job") echo "JobId=$3 JobName=x JobState=RUNNING Reason=None Restarts=0 ExcNodeList=(null)";;
esac
"""
DRAIN = {"slurmedic_nodes": ["gpu02", "gpu01"], "slurmedic_reason": "slurmedic: 7.0 gpu_hardware"}
REQUEUE = {"slurmedic_job": 7, "slurmedic_attempt": 0, "slurmedic_exclude": ["gpu02"]}


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "calls.log"
    stand_in(tmp_path, monkeypatch, "scontrol", SCONTROL.format(log=log))
    return log


def renamed_playbooks(dest: Path) -> Path:
    """A copy of the playbooks with every play and task renamed."""
    shutil.copytree(PLAYBOOKS, dest)
    for path in dest.glob("*.yml"):
        plays = yaml.safe_load(path.read_text())
        for p, play in enumerate(plays):
            play["name"] = f"Play {p} renamed"
            for t, task in enumerate(play.get("tasks", [])):
                task["name"] = f"Step {t} of play {p}, renamed"
        path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return dest


@pytest.mark.parametrize(
    ("playbook", "extravars", "commands"),
    [
        (
            "drain_nodes",
            DRAIN,
            [
                "scontrol update nodename=gpu02,gpu01 state=drain"
                ' reason="slurmedic: 7.0 gpu_hardware"'
            ],
        ),
        (
            "requeue_job",
            REQUEUE,
            [
                "scontrol requeuehold 7",
                "scontrol update jobid=7 ExcNodeList=gpu02",
                "scontrol release 7",
            ],
        ),
        ("stop_job", {"slurmedic_job": 7, "slurmedic_attempt": 0}, ["scancel 7"]),
    ],
)
def test_a_dry_run_records_the_same_commands_whatever_the_tasks_are_called(
    playbook: str, extravars: dict[str, object], commands: list[str], scontrol: Path, tmp_path: Path
) -> None:
    renamed = renamed_playbooks(tmp_path / "renamed")
    assert "Commands" not in (renamed / f"{playbook}.yml").read_text()
    results: list[RunResult] = []
    for playbooks in (PLAYBOOKS, renamed):
        result = run_playbook(playbook, extravars, check=True, playbooks=playbooks)
        assert result.ok, result.output[-2000:]
        results.append(result)
    assert [r.commands for r in results] == [commands, commands]
    # What the playbook read, for the console's before -> after.
    before = {
        "drain_nodes": {"gpu02": "ALLOCATED", "gpu01": "ALLOCATED"},
        "requeue_job": {"JobState": "RUNNING", "Restarts": "0", "ExcNodeList": "(null)"},
        "stop_job": {"JobState": "RUNNING", "Restarts": "0", "ExcNodeList": "(null)"},
    }[playbook]
    assert [r.before for r in results] == [before, before]
    # Check mode is honest: Slurm was only read, never changed.
    calls = scontrol.read_text().splitlines()
    assert calls and all(c.startswith("show ") for c in calls), calls
    assert [r.changed for r in results] == [[], []]


@pytest.mark.parametrize(
    ("shown", "commands"),
    [
        # Slurm requeued it by itself: the successor waits (or the attempt it ended is still
        # cleaned up): the exclusion is widened, in the order Slurm listed it.
        ("JobState=PENDING", ["scontrol update jobid=7 ExcNodeList=gpu09,gpu04,gpu02"]),
        ("JobState=COMPLETING", ["scontrol update jobid=7 ExcNodeList=gpu09,gpu04,gpu02"]),
        # An expedited requeue (25.11 and later) until Slurm relaunches it.
        ("JobState=EXPEDITING", ["scontrol update jobid=7 ExcNodeList=gpu09,gpu04,gpu02"]),
        # The successor runs: nothing to requeue (where it runs is checked for real).
        ("JobState=RUNNING", []),
    ],
)
def test_a_job_slurm_requeued_has_its_exclusion_widened_while_its_successor_waits(
    shown: str, commands: list[str], scontrol: Path
) -> None:
    fake = Path(shutil.which("scontrol") or "")
    job = f"{shown} Reason=None Restarts=1 ExcNodeList=gpu[03,09],gpu04 NodeList=gpu05"
    hostnames = '  "show hostnames") echo gpu03; echo gpu09; echo gpu04;;\n'
    fake.write_text(
        fake.read_text()
        .replace("JobState=RUNNING Reason=None Restarts=0 ExcNodeList=(null)", job)
        .replace("esac", hostnames + "esac")
    )
    extravars = {**REQUEUE, "slurmedic_readmit": ["gpu03"]}
    results = [run_playbook("requeue_job", extravars, check=True) for _ in range(2)]
    assert all(r.ok for r in results), results[0].output[-2000:]
    assert [r.commands for r in results] == [commands, commands]


@pytest.mark.parametrize(
    ("shown", "commands"),
    [
        # Slurm requeued and held the job after the attempt decided about (an expedited
        # requeue's run that exited non-zero): its successor never ran, and is cancelled.
        ("JobState=REQUEUE_HOLD Reason=job_requeued_in_held_state Restarts=1", ["scancel 7"]),
        # Held by a person, or requeued and running again: not the attempt decided about.
        ("JobState=PENDING Reason=JobHeldUser Restarts=1", []),
        ("JobState=RUNNING Reason=None Restarts=1", []),
    ],
)
def test_a_stop_cancels_the_successor_slurm_holds_after_the_attempt(
    shown: str, commands: list[str], scontrol: Path
) -> None:
    fake = Path(shutil.which("scontrol") or "")
    fake.write_text(fake.read_text().replace("JobState=RUNNING Reason=None Restarts=0", shown))
    result = run_playbook("stop_job", {"slurmedic_job": 7, "slurmedic_attempt": 0}, check=True)
    assert result.ok and result.commands == commands, result.output[-2000:]


def test_nothing_to_do_is_recorded_as_no_commands(scontrol: Path, tmp_path: Path) -> None:
    fake = Path(shutil.which("scontrol") or "")
    fake.write_text(fake.read_text().replace("State=ALLOCATED", "State=ALLOCATED+DRAIN"))
    result = run_playbook("drain_nodes", DRAIN, check=True)
    assert result.ok and result.commands == []


def test_diagnostics_are_read_from_the_stats_whatever_the_tasks_are_called(
    scontrol: Path, tmp_path: Path
) -> None:
    slurmd_log = tmp_path / "slurmd.log"
    slurmd_log.write_text("".join(f"line {i}\n" for i in range(10)))
    inventory = tmp_path / "hosts.yml"
    node = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "slurmedic_nvidia_smi": ["echo", "<nvidia_smi_log/>"],
        "slurmedic_slurmd_log": str(slurmd_log),
    }
    hosts = {"localhost": {"ansible_connection": "local"}}
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "slurm_controller": {"hosts": hosts},
                        "slurm_nodes": {"hosts": {"gpu01": node, "gpu02": node}},
                    }
                }
            }
        )
    )
    extravars = {"slurmedic_nodes": ["gpu01", "gpu02"], "slurmedic_incident": "7.0"}
    extravars["slurmedic_tail_lines"] = 3
    found = []
    for playbooks in (PLAYBOOKS, renamed_playbooks(tmp_path / "renamed")):
        result = run_playbook(
            "collect_diagnostics", extravars, check=True, inventory=inventory, playbooks=playbooks
        )
        assert result.ok, result.output[-2000:]
        found.append(result.diagnostics)
    for diagnostics in found:
        assert sorted(diagnostics) == ["gpu01", "gpu02"]
        for host, d in diagnostics.items():
            assert d["node"] == host
            assert d["nvidia_smi"]["stdout"] == "<nvidia_smi_log/> -q -x"
            assert d["nvlink_errors"]["stdout"] == "<nvidia_smi_log/> nvlink -e"
            # Slurm is read where slurmedic runs, even in check mode: it only reads.
            assert d["slurm_node"]["stdout"] == f"NodeName={host} State=ALLOCATED Reason=(null)"
            assert d["slurmd_log"]["stdout"] == "line 7\nline 8\nline 9"
    assert found[0] == found[1]
    assert sorted(set(scontrol.read_text().splitlines())) == [
        "show node gpu01 --oneliner",
        "show node gpu02 --oneliner",
    ]


def _drain_check(name: str, tmp_path: Path) -> str:
    """drain_nodes' own check of a node name, bypassing slurmedic's: ansible-runner directly."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    r = ansible_runner.run(
        private_data_dir=str(workdir),
        playbook=str(PLAYBOOKS / "drain_nodes.yml"),
        inventory=str(PLAYBOOKS.parent / "inventory" / "hosts.yml"),
        extravars={"slurmedic_nodes": [name], "slurmedic_reason": "slurmedic: 7.0 network"},
        cmdline="--check",
        quiet=True,
        timeout=120,
    )
    failed = [e["event_data"]["task"] for e in r.events if e.get("event") == "runner_on_failed"]
    if not failed:
        assert r.status == "successful", r.stdout.read()  # it ran, rather than failed to start
    return failed[0] if failed else "passed"


@pytest.mark.parametrize(
    ("name", "core_accepts"),
    [
        ("gpu-a01.rack_2", True),
        ("-gpu01", False),
        ("gpu01;reboot", False),
        ("a" * 65, False),
        ("gpu01\n", False),  # `$` would match before the newline; the patterns end in \Z
    ],
)
def test_the_playbooks_check_node_names_as_the_core_does(
    name: str, core_accepts: bool, scontrol: Path, tmp_path: Path
) -> None:
    assert bool(NODE_NAME.match(name)) is core_accepts
    assert _drain_check(name, tmp_path) == (
        "passed" if core_accepts else "Check the request's values"
    )
    assert scontrol.exists() is core_accepts  # refused before Slurm is asked anything


def test_the_node_name_pattern_is_spelled_once() -> None:
    pattern = NODE_NAME.pattern
    assert pattern in playbook_vars_file().read_text()
    playbooks = [p for p in PLAYBOOKS.glob("*.yml") if "{0,63}" in p.read_text()]
    assert playbooks == []
    modules = PLAYBOOKS.parent.joinpath("webhook").rglob("*.py")
    assert [p for p in modules if pattern in p.read_text()] == []
    for path in PLAYBOOKS.glob("*.yml"):
        text = path.read_text()
        if "slurmedic_node_name_pattern" in text or "slurmedic_job_id_pattern" in text:
            first = yaml.safe_load(text)[0]
            assert first.get("vars_files") == ["vars/slurmedic.yml"], path.name


def test_a_run_cut_short_still_records_what_it_set_out_to_do(
    scontrol: Path, tmp_path: Path
) -> None:
    """Its timeout stops the run before Ansible's stats: the set_stats it had reported count."""
    fake = Path(shutil.which("scontrol") or "")
    # The drain hangs, as a slurmctld that stopped answering does (the stand-in gives up later).
    fake.write_text(fake.read_text().replace("esac", '  "update "*) exec sleep 40;;\nesac'))
    result = run_playbook("drain_nodes", DRAIN, check=False, timeout=20)
    assert result.status == "timeout"
    assert result.commands == [
        'scontrol update nodename=gpu02,gpu01 state=drain reason="slurmedic: 7.0 gpu_hardware"'
    ]
