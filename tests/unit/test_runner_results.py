"""What the runner makes of a playbook's run: the extra vars it lets through to the repair
playbooks (reset_gpu, reboot_nodes, health_check), how it writes them for Ansible (data, never a
template, each string still a string), and what it reads back from their stats (each node's
reset and health check, as the playbooks report them; the real playbooks'
reports: tests/service/test_repair_playbooks.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import is_trusted_as_template
from pydantic import ValidationError

from webhook.executor.runner import (
    PLAYBOOK_VARS,
    HealthCheckVars,
    RebootVars,
    ResetVars,
    RunResult,
    _UnsafeDumper,
    node_results,
    reported,
    take_stats,
    untrusted,
)

DCGM = ["dcgmi", "diag", "-r", "2"]
HEALTH = {
    "slurmedic_nodes": ["gpu01"],
    "slurmedic_incident": "repair:gpu01:3",
    "slurmedic_health_check_default": DCGM,
}


def test_each_repair_playbook_has_its_vars() -> None:
    assert PLAYBOOK_VARS["reset_gpu"] is ResetVars
    assert PLAYBOOK_VARS["reboot_nodes"] is RebootVars
    assert PLAYBOOK_VARS["health_check"] is HealthCheckVars


def test_a_health_check_takes_the_policy_s_command_and_a_timeout() -> None:
    evars = HealthCheckVars.model_validate(HEALTH).model_dump(exclude_none=True)
    assert evars["slurmedic_health_check_default"] == DCGM
    assert evars["slurmedic_health_check_timeout"] == 1800


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"slurmedic_health_check_default": ["dcgmi", "diag\n-r", "2"]}, "default.1"),
        ({"slurmedic_health_check_default": ["dcgmi", "diag", "-r", 2]}, "default.3"),
        ({"slurmedic_health_check_default": []}, "default"),
        ({"slurmedic_health_check_default": ["x"] * 33}, "default"),
        ({"slurmedic_health_check_default": ["a" * 257]}, "default.0"),
        ({"slurmedic_health_check_default": ["dcgmi\t"]}, "default.0"),
        ({"slurmedic_health_check_timeout": 0}, "timeout"),
        ({"slurmedic_nodes": ["gpu01\n"]}, "nodes.0"),
        ({"slurmedic_incident": "repair:gpu 01"}, "incident"),
        ({"slurmedic_fence": "fence"}, "fence"),
        ({"slurmedic_health_check": DCGM}, "slurmedic_health_check"),  # the inventory's name
    ],
)
def test_a_bad_health_check_request_names_its_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        HealthCheckVars.model_validate({**HEALTH, **change})
    (error,) = e.value.errors()
    assert ".".join(map(str, error["loc"])).endswith(field)


def test_a_reboot_takes_a_slurmedic_reason_and_a_reset_an_incident() -> None:
    reboot = {"slurmedic_nodes": ["gpu01"], "slurmedic_reason": "slurmedic: repair:gpu01 reboot"}
    assert RebootVars.model_validate(reboot).slurmedic_reason == reboot["slurmedic_reason"]
    with pytest.raises(ValidationError, match="slurmedic_reason"):
        RebootVars.model_validate({**reboot, "slurmedic_reason": "maintenance"})
    reset = {"slurmedic_nodes": ["gpu01"], "slurmedic_incident": "repair:gpu01"}
    assert ResetVars.model_validate(reset).slurmedic_nodes == ["gpu01"]
    with pytest.raises(ValidationError, match="slurmedic_nodes"):
        ResetVars.model_validate({**reset, "slurmedic_nodes": []})


def test_extra_vars_reach_ansible_as_data_with_their_strings_intact(tmp_path: Path) -> None:
    """One `!unsafe` over the whole: Ansible re-reads a scalar tagged on its own as if unquoted
    ("02" became 2, "true" a boolean), a command's argv must keep its strings."""
    evars = {
        "slurmedic_health_check_default": ["dcgmi", "02", "true", "null", "0x1f", "{{ x }}"],
        "slurmedic_nodes": ["123"],
        "slurmedic_reason": "2461\n",
        "slurmedic_health_check_timeout": 1800,
    }
    path = tmp_path / "vars.yml"
    path.write_text(yaml.dump(untrusted(evars), Dumper=_UnsafeDumper))
    # As ansible-playbook reads `--extra-vars @file`: trusted as templates, but for !unsafe.
    loaded = DataLoader().load_from_file(str(path), trusted_as_template=True)
    assert loaded == evars
    strings = [*loaded["slurmedic_health_check_default"], *loaded["slurmedic_nodes"]]
    assert all(type(s) is not int and isinstance(s, str) for s in strings)
    assert not any(is_trusted_as_template(s) for s in [*strings, loaded["slurmedic_reason"]])


def test_each_node_s_reset_and_health_check_are_read_from_the_stats() -> None:
    result = RunResult("health_check", False, "successful", 0)
    take_stats(
        result,
        {
            "slurmedic_commands": ["gpu01: timeout --kill-after=30 1800 dcgmi diag -r 2"],
            "slurmedic_health": {
                "gpu01": {"rc": 0, "output": "Pass - All"},
                "gpu02": {"rc": "226", "output": "Fail - GPU: 3"},  # as a string template gives
                "gpu03": {"rc": -1, "output": "not in the inventory: not checked"},
            },
        },
    )
    assert result.commands == ["gpu01: timeout --kill-after=30 1800 dcgmi diag -r 2"]
    assert result.health == {
        "gpu01": {"rc": 0, "output": "Pass - All"},
        "gpu02": {"rc": 226, "output": "Fail - GPU: 3"},
        "gpu03": {"rc": -1, "output": "not in the inventory: not checked"},
    }
    assert result.reset == {}
    assert result.summary()["health"] == {"gpu01": 0, "gpu02": 226, "gpu03": -1}
    assert "reset" not in result.summary()


@pytest.mark.parametrize(
    ("value", "read"),
    [
        ({"gpu01": {"rc": 0, "output": "reset"}}, {"gpu01": {"rc": 0, "output": "reset"}}),
        # What no playbook should report reads as a command that never ran, or not at all.
        ({"gpu01": {"rc": "x", "output": None}}, {"gpu01": {"rc": -1, "output": ""}}),
        ({"gpu01": {"rc": True, "output": "x"}}, {"gpu01": {"rc": -1, "output": "x"}}),
        ({"gpu01": {"output": "x"}}, {"gpu01": {"rc": -1, "output": "x"}}),
        ({"gpu01": "rc 0"}, {}),
        (["gpu01"], {}),
        (None, {}),
    ],
)
def test_a_node_s_result_is_an_rc_and_an_output(value: Any, read: dict[str, Any]) -> None:
    assert node_results(value) == read


def test_the_resets_reported_so_far_are_kept_when_a_run_is_cut_short() -> None:
    """A run killed at its timeout ends before the stats: each node's set_stats, merged."""

    def stats(node: str, rc: int) -> dict[str, Any]:
        data = {"slurmedic_reset": {node: {"rc": rc, "output": ""}}}
        res = {"ansible_stats": {"data": data, "per_host": False, "aggregate": True}}
        return {"event": "runner_on_ok", "event_data": {"task_action": "set_stats", "res": res}}

    result = RunResult("reset_gpu", False, "timeout", 254)
    take_stats(result, reported([stats("gpu01", 0), stats("gpu02", 3)]))
    assert result.reset == {"gpu01": {"rc": 0, "output": ""}, "gpu02": {"rc": 3, "output": ""}}
    assert result.summary()["reset"] == {"gpu01": 0, "gpu02": 3}
