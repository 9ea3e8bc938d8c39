"""The repair playbooks (reset_gpu, reboot_nodes, health_check) and resume_nodes after a reboot:
their own checks refuse a bad request before any command; what they plan, run and report, with
real ansible-runner on localhost against a stand-in `scontrol` that answers from a table of
nodes and logs its calls, and a stand-in `nvidia-smi`. Check mode runs nothing that changes a
node, nor the heavy health check."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.service.conftest import stand_in
from tests.service.test_playbook_checks import JINJA, MARK, run
from webhook.executor.runner import run_playbook

# A node as `scontrol show node --oneliner` shows it: name, state, reason (and who set it).
SLURMEDIC = "Reason=slurmedic: 7.0 gpu_hardware [slurm@2026-12-01T10:00:00]"
OTHER = "Reason=maintenance [root@2026-12-01T10:00:00]"
SCONTROL = """#!/bin/sh
echo "$@" >> "{log}"
nodes="{nodes}"
# A changed table, from the second read on (a node taken over between a plan and its act).
[ -e "{nodes}.later" ] && [ -e "{log}.read" ] && nodes="{nodes}.later"
case "$1 $2" in
  "show node")
    touch "{log}.read"
    for n in $(echo "$3" | tr , ' '); do
      grep "^NodeName=$n " "$nodes" || {{ echo "Node $n not found" >&2; exit 1; }}
    done;;
esac
"""
NVIDIA_SMI = """#!/bin/sh
echo "$@" >> "{log}"
echo "GPU 00000000:07:00.0 was successfully reset."
"""


def line(node: str, state: str, reason: str = SLURMEDIC) -> str:
    return f"NodeName={node} Arch=x86_64 CPUAlloc=0 State={state} ThreadsPerCore=1 {reason}"


class Slurm:
    """The stand-in's table of nodes and its log of calls."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.nodes, self.log = tmp / "nodes.txt", tmp / "scontrol.log"
        stand_in(tmp, monkeypatch, "scontrol", SCONTROL.format(log=self.log, nodes=self.nodes))

    def show(self, *lines: str, later: bool = False) -> None:
        path = self.nodes.with_name(self.nodes.name + ".later") if later else self.nodes
        path.write_text("".join(f"{x}\n" for x in lines))

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Slurm:
    return Slurm(tmp_path, monkeypatch)


def inventory(tmp: Path, nodes: dict[str, dict[str, Any]]) -> Path:
    """The controller and `nodes` (with their host vars), all this machine."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    path = tmp / "inventory.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "slurm_controller": {"hosts": {"localhost": local}},
                        "slurm_nodes": {"hosts": {n: {**local, **v} for n, v in nodes.items()}},
                    }
                }
            }
        )
    )
    return path


DCGM = ["dcgmi", "diag", "-r", "2"]
GOOD = {
    "reset_gpu": {"slurmedic_nodes": ["gpu01"], "slurmedic_incident": "repair:gpu01"},
    "reboot_nodes": {
        "slurmedic_nodes": ["gpu01"],
        "slurmedic_reason": "slurmedic: repair:gpu01 reboot",
    },
    "health_check": {
        "slurmedic_nodes": ["gpu01"],
        "slurmedic_incident": "repair:gpu01:3",
        "slurmedic_health_check_default": DCGM,
    },
}


def bad(playbook: str, **change: Any) -> tuple[str, dict[str, Any]]:
    return playbook, {**GOOD[playbook], **change}


@pytest.mark.parametrize(
    ("playbook", "evars"),
    [
        bad("reset_gpu", slurmedic_nodes=[JINJA]),
        bad("reset_gpu", slurmedic_nodes=["gpu01\n"]),
        bad("reset_gpu", slurmedic_nodes="gpu01,gpu02"),
        bad("reset_gpu", slurmedic_nodes=[]),
        bad("reset_gpu", slurmedic_incident=f"repair:{JINJA}"),
        bad("reset_gpu", slurmedic_incident="repair:gpu01\n"),
        bad("reset_gpu", slurmedic_fence="relative/fence"),
        bad("reboot_nodes", slurmedic_nodes=[JINJA]),
        bad("reboot_nodes", slurmedic_nodes="gpu01"),
        bad("reboot_nodes", slurmedic_reason="maintenance"),
        bad("reboot_nodes", slurmedic_reason=f"slurmedic: {JINJA}"),
        bad("health_check", slurmedic_nodes=["gpu 01"]),
        bad("health_check", slurmedic_nodes="gpu01"),
        bad("health_check", slurmedic_incident="repair:" + "a" * 80),
        # The command: a list of 1 to 32 printable strings, each a whole argument.
        bad("health_check", slurmedic_health_check_default=["dcgmi", "diag\n-r", "2"]),
        bad("health_check", slurmedic_health_check_default=["dcgmi", "diag", "-r", 2]),
        bad("health_check", slurmedic_health_check_default=[]),
        bad("health_check", slurmedic_health_check_default="dcgmi diag -r 2"),
        bad("health_check", slurmedic_health_check_default={"dcgmi": "diag"}),
        bad("health_check", slurmedic_health_check_default=["x"] * 33),
        bad("health_check", slurmedic_health_check_default=["a" * 257]),
        bad("health_check", slurmedic_health_check_timeout="60"),
        bad("health_check", slurmedic_health_check_timeout=0),
    ],
)
def test_a_bad_request_fails_in_the_checks_and_is_never_templated(
    tmp_path: Path, playbook: str, evars: dict[str, Any]
) -> None:
    rc, failed, output = run(tmp_path, playbook, evars)
    assert rc != 0
    assert failed == ["Check the request's values"], output[-3000:]
    assert not (tmp_path / MARK).exists()


@pytest.mark.parametrize("playbook", sorted(GOOD))
def test_the_good_request_passes_the_checks(tmp_path: Path, playbook: str) -> None:
    rc, failed, output = run(tmp_path, playbook, GOOD[playbook])
    # The checks' inventory lists no node: reset_gpu and health_check have nothing to run
    # after them; reboot_nodes fails on its first scontrol (no Slurm here).
    if playbook == "reboot_nodes":
        assert rc != 0 and failed == ["Read the nodes' state"], output[-3000:]
    else:
        assert rc == 0 and failed == [], output[-3000:]
        assert "Check the request's types" in output


def test_a_health_check_in_check_mode_only_says_what_it_would_run(tmp_path: Path) -> None:
    default, own = tmp_path / "by-the-policy", tmp_path / "by-the-inventory"
    hosts = inventory(
        tmp_path,
        {"gpu01": {}, "gpu02": {"slurmedic_health_check": ["touch", str(own)]}},
    )
    evars = {
        "slurmedic_nodes": ["gpu01", "gpu02", "gpu09"],
        "slurmedic_incident": "repair:gpu01",
        "slurmedic_health_check_default": ["touch", str(default)],
    }
    dry = run_playbook("health_check", evars, check=True, inventory=hosts)
    assert dry.ok, dry.output[-3000:]
    # Each node's command: the inventory's where it names one, else the request's (bounded by
    # the request's timeout, 1800 s unless it says).
    assert sorted(dry.commands) == [
        f"gpu01: timeout --kill-after=30 1800 touch {default}",
        f"gpu02: timeout --kill-after=30 1800 touch {own}",
    ]
    assert not default.exists() and not own.exists()
    assert dry.health == {}

    done = run_playbook("health_check", evars, check=False, inventory=hosts)
    assert done.ok, done.output[-3000:]
    assert default.exists() and own.exists()
    assert done.health == {
        "gpu01": {"rc": 0, "output": ""},
        "gpu02": {"rc": 0, "output": ""},
        "gpu09": {"rc": -1, "output": "not in the inventory: not checked"},
    }
    assert done.summary()["health"] == {"gpu01": 0, "gpu02": 0, "gpu09": -1}


def test_a_command_is_passed_as_it_is_never_templated(tmp_path: Path) -> None:
    hosts = inventory(tmp_path, {"gpu01": {}})
    evars = {**GOOD["health_check"], "slurmedic_health_check_default": ["echo", JINJA]}
    done = run_playbook("health_check", evars, check=False, inventory=hosts)
    assert done.ok, done.output[-3000:]
    assert done.health["gpu01"] == {"rc": 0, "output": JINJA}
    assert not (tmp_path / MARK).exists() and not Path(MARK).exists()


def test_a_failed_health_check_is_a_result_with_its_output_s_tail(tmp_path: Path) -> None:
    script = "for i in $(seq 1 250); do echo line $i; done; echo 'Fail - GPU: 3' >&2; exit 226"
    hosts = inventory(tmp_path, {"gpu01": {"slurmedic_health_check": ["sh", "-c", script]}})
    evars = {**GOOD["health_check"], "slurmedic_health_check_default": DCGM}
    done = run_playbook("health_check", evars, check=False, inventory=hosts)
    assert done.ok, done.output[-3000:]
    lines = done.health["gpu01"]["output"].splitlines()
    assert done.health["gpu01"]["rc"] == 226
    assert len(lines) == 200 and lines[0] == "line 52" and lines[-1] == "Fail - GPU: 3"


def test_a_check_that_hangs_or_a_node_out_of_reach_is_recorded_and_the_rest_checked(
    tmp_path: Path,
) -> None:
    hosts = inventory(
        tmp_path,
        {
            "gpu01": {"slurmedic_health_check": ["sleep", "600"]},
            "gpu02": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1},
            "gpu03": {"slurmedic_health_check": ["true"]},
        },
    )
    evars = {
        **GOOD["health_check"],
        "slurmedic_nodes": ["gpu01", "gpu02", "gpu03"],
        "slurmedic_health_check_timeout": 1,
    }
    done = run_playbook("health_check", evars, check=False, inventory=hosts)
    assert done.ok, done.output[-3000:]
    assert done.health["gpu01"]["rc"] == 124  # coreutils' timeout: killed
    assert (
        done.health["gpu02"]["rc"] == -1 and "Connection refused" in done.health["gpu02"]["output"]
    )
    assert done.unreachable == ["gpu02"]
    assert done.health["gpu03"] == {"rc": 0, "output": ""}


def test_an_inventory_s_malformed_command_is_refused(tmp_path: Path) -> None:
    mark = tmp_path / "ran"
    hosts = inventory(tmp_path, {"gpu01": {"slurmedic_health_check": f"touch {mark}"}})
    done = run_playbook("health_check", GOOD["health_check"], check=False, inventory=hosts)
    assert not done.ok and not mark.exists()
    assert "slurmedic_health_check of gpu01 is not a list" in done.output


@pytest.fixture
def nvidia_smi(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in nvidia-smi (by the inventory, as a site's own path) and its log."""
    log = tmp_path / "nvidia-smi.log"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(NVIDIA_SMI.format(log=log))
    fake.chmod(0o755)
    return fake, log


def test_only_an_idle_node_slurmedic_drained_has_its_gpus_reset(
    slurm: Slurm, nvidia_smi: tuple[Path, Path], tmp_path: Path
) -> None:
    fake, log = nvidia_smi
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
    hosts = inventory(tmp_path, {n: {"slurmedic_nvidia_smi": [str(fake)]} for n in nodes})
    slurm.show(
        line("gpu01", "IDLE+DRAIN"),
        line("gpu02", "MIXED+DRAIN"),  # draining: a job still runs
        line("gpu03", "IDLE+DRAIN", OTHER),  # a person's drain
        line("gpu04", "IDLE+COMPLETING+DRAIN"),
        line("gpu05", "IDLE+DRAIN+REBOOT_REQUESTED"),
    )
    evars = {"slurmedic_nodes": nodes, "slurmedic_incident": "repair:gpu01"}
    dry = run_playbook("reset_gpu", evars, check=True, inventory=hosts)
    assert dry.ok, dry.output[-3000:]
    assert dry.commands == [f"gpu01: {fake} -r"]
    assert dry.before["gpu02"] == "MIXED+DRAIN" and dry.reset == {}
    assert not log.exists()

    done = run_playbook("reset_gpu", evars, check=False, inventory=hosts)
    assert done.ok, done.output[-3000:]
    assert log.read_text() == "-r\n"
    assert done.reset["gpu01"] == {
        "rc": 0,
        "output": "GPU 00000000:07:00.0 was successfully reset.",
    }
    assert done.reset["gpu02"]["rc"] == -1
    assert done.reset["gpu02"]["output"].startswith("not drained by slurmedic and idle")
    assert "State=MIXED+DRAIN" in done.reset["gpu02"]["output"]
    assert "Reason=maintenance" in done.reset["gpu03"]["output"]
    assert [done.reset[n]["rc"] for n in nodes] == [0, -1, -1, -1, -1]
    # Slurm was only read: on the slurmedic host for the plan, on the node before the reset.
    assert all(c.startswith("show node ") for c in slurm.calls())
    # The plan's read in each run, and the act's read in the real run (none in check mode).
    assert slurm.calls().count("show node gpu01 --oneliner") == 3


def test_a_node_taken_over_since_the_plan_is_not_reset(
    slurm: Slurm, nvidia_smi: tuple[Path, Path], tmp_path: Path
) -> None:
    fake, log = nvidia_smi
    hosts = inventory(tmp_path, {"gpu01": {"slurmedic_nvidia_smi": [str(fake)]}})
    slurm.show(line("gpu01", "IDLE+DRAIN"))
    # A person resumed it and a job started, between the plan's read and the act's.
    slurm.show(line("gpu01", "ALLOCATED", "Reason=(null)"), later=True)
    done = run_playbook("reset_gpu", GOOD["reset_gpu"], check=False, inventory=hosts)
    assert done.ok, done.output[-3000:]  # nothing went wrong: nothing was due any more
    assert not log.exists()
    assert done.reset["gpu01"]["rc"] == -1
    assert "changed since it was read: State=ALLOCATED" in done.reset["gpu01"]["output"]


def test_a_reset_that_fails_is_reported_and_fails_the_run(slurm: Slurm, tmp_path: Path) -> None:
    failing = ["sh", "-c", "echo busy >&2; exit 3", "nvidia-smi"]  # then `-r`: $1
    hosts = inventory(tmp_path, {"gpu01": {"slurmedic_nvidia_smi": failing}})
    slurm.show(line("gpu01", "IDLE+DRAIN"))
    done = run_playbook("reset_gpu", GOOD["reset_gpu"], check=False, inventory=hosts)
    assert not done.ok
    assert done.reset == {"gpu01": {"rc": 3, "output": "busy"}}


@pytest.mark.parametrize(
    ("smi", "said"),
    [
        # A reset that hangs is killed with what it started, at the node's reset timeout.
        (["sh", "-c", "sleep 600", "nvidia-smi"], "sh did not end within 1 s: killed"),
        (["/nonexistent/nvidia-smi"], "/nonexistent/nvidia-smi could not be run"),
    ],
)
def test_a_reset_that_cannot_end_is_reported_and_fails_the_run(
    slurm: Slurm, tmp_path: Path, smi: list[str], said: str
) -> None:
    node = {"slurmedic_nvidia_smi": smi, "slurmedic_reset_timeout": 1}
    hosts = inventory(tmp_path, {"gpu01": node})
    slurm.show(line("gpu01", "IDLE+DRAIN"))
    done = run_playbook("reset_gpu", GOOD["reset_gpu"], check=False, inventory=hosts)
    assert not done.ok
    assert done.reset["gpu01"]["rc"] == -1
    assert done.reset["gpu01"]["output"].startswith(said), done.reset


def test_a_reboot_asks_slurm_only_for_nodes_slurmedic_drained_with_no_job(
    slurm: Slurm, tmp_path: Path
) -> None:
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06"]
    slurm.show(
        line("gpu01", "IDLE+DRAIN"),
        line("gpu02", "ALLOCATED+DRAIN"),  # draining
        line("gpu03", "IDLE+DRAIN", OTHER),
        line("gpu04", "DOWN+DRAIN+NOT_RESPONDING"),  # went down after slurmedic drained it
        line("gpu05", "IDLE+DRAIN+REBOOT_ISSUED"),  # already rebooting
        line("gpu06", "DOWN+REBOOT_REQUESTED"),
    )
    evars = {"slurmedic_nodes": nodes, "slurmedic_reason": "slurmedic: repair:gpu01 reboot"}
    command = (
        'scontrol reboot ASAP nextstate=DOWN reason="slurmedic: repair:gpu01 reboot" gpu01,gpu04'
    )
    dry = run_playbook("reboot_nodes", evars, check=True)
    assert dry.ok, dry.output[-3000:]
    assert dry.commands == [command]
    assert dry.before == {
        "gpu01": "IDLE+DRAIN",
        "gpu02": "ALLOCATED+DRAIN",
        "gpu03": "IDLE+DRAIN",
        "gpu04": "DOWN+DRAIN+NOT_RESPONDING",
        "gpu05": "IDLE+DRAIN+REBOOT_ISSUED",
        "gpu06": "DOWN+REBOOT_REQUESTED",
    }
    assert all(c.startswith("show node ") for c in slurm.calls())

    done = run_playbook("reboot_nodes", evars, check=False)
    assert done.ok, done.output[-3000:]
    assert done.commands == [command]
    reboots = [c for c in slurm.calls() if not c.startswith("show ")]
    assert reboots == [
        "reboot ASAP nextstate=DOWN reason=slurmedic: repair:gpu01 reboot gpu01,gpu04"
    ]
    assert done.after["State"]["gpu01"] == "IDLE+DRAIN"  # the stand-in does not reboot
    assert done.after["Reason"]["gpu03"] == "maintenance"


def test_a_reboot_already_asked_for_is_not_asked_again(slurm: Slurm) -> None:
    slurm.show(line("gpu01", "IDLE+DRAIN+REBOOT_REQUESTED"))
    done = run_playbook("reboot_nodes", GOOD["reboot_nodes"], check=False)
    assert done.ok and done.commands == []
    assert all(c.startswith("show node ") for c in slurm.calls())


def test_a_node_someone_resumed_since_the_plan_fails_the_reboot(slurm: Slurm) -> None:
    slurm.show(line("gpu01", "IDLE+DRAIN"))
    slurm.show(line("gpu01", "IDLE", "Reason=(null)"), later=True)
    done = run_playbook("reboot_nodes", GOOD["reboot_nodes"], check=False)
    assert not done.ok
    assert "changed since it was read: State=IDLE" in done.output
    assert all(c.startswith("show node ") for c in slurm.calls())


def test_a_node_back_from_slurmedic_s_reboot_is_resumed(slurm: Slurm) -> None:
    slurm.show(
        line("gpu01", "DOWN"),  # back from slurmedic's reboot, nextstate=DOWN
        line("gpu02", "DOWN+DRAIN"),  # the same, on a release that keeps the drain
        line("gpu03", "IDLE+DRAIN"),  # drained, as before
        line("gpu04", "DOWN", OTHER),  # someone else's
        line("gpu05", "DOWN+NOT_RESPONDING"),  # not back
        line("gpu06", "DOWN+REBOOT_ISSUED"),  # still rebooting
        line("gpu07", "DOWN", "Reason=Not responding [slurm@2026-12-01T10:00:00]"),
    )
    nodes = [f"gpu0{i}" for i in range(1, 8)]
    dry = run_playbook("resume_nodes", {"slurmedic_nodes": nodes}, check=True)
    assert dry.ok, dry.output[-3000:]
    assert dry.commands == ["scontrol update nodename=gpu01,gpu02,gpu03 state=resume"]
    done = run_playbook("resume_nodes", {"slurmedic_nodes": nodes}, check=False)
    assert done.ok, done.output[-3000:]
    assert [c for c in slurm.calls() if not c.startswith("show ")] == [
        "update nodename=gpu01,gpu02,gpu03 state=resume"
    ]
