"""The playbooks' own checks, a second line of defence behind slurmedic's: called without
slurmedic's validation (ansible-playbook with an extra-vars file whose strings are !unsafe, as
slurmedic writes them), a bad request fails in the checks, before any command, and an input is
never templated. Real ansible-playbook; no Slurm is needed, as nothing gets past the checks
but the one good request (which then fails on the first scontrol, no Slurm being here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.executor.runner import PLAYBOOKS, _UnsafeDumper, untrusted


def run(
    tmp: Path, playbook: str, evars: dict[str, Any], *, unsafe: bool = True
) -> tuple[int, list[str], str]:
    """rc, the tasks that failed, the output. `unsafe`: the request as slurmedic writes it (one
    mapping tagged !unsafe); else plain YAML, untagged, as a caller of its own may write it."""
    (tmp / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "slurm_controller": {
                            "hosts": {
                                "localhost": {
                                    "ansible_connection": "local",
                                    "ansible_python_interpreter": sys.executable,
                                }
                            }
                        }
                    }
                }
            }
        )
    )
    text = yaml.dump(untrusted(evars), Dumper=_UnsafeDumper) if unsafe else yaml.safe_dump(evars)
    (tmp / "vars.yml").write_text(text)
    bin_dir = Path(sys.executable).parent
    out = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", str(tmp / "hosts.yml"),
         str(PLAYBOOKS / f"{playbook}.yml"), "--extra-vars", f"@{tmp / 'vars.yml'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1",
             "HOME": str(tmp)},
    )  # fmt: skip
    failed, task = [], ""
    for line in out.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK [") : line.rindex("]")]
        elif line.startswith(("fatal:", "failed:")) and task not in failed:
            failed.append(task)
    return out.returncode, failed, out.stdout + out.stderr


MARK = "slurmedic-templated"
JINJA = "{{ lookup('ansible.builtin.pipe', 'touch " + MARK + "') }}"


@pytest.mark.parametrize(
    ("playbook", "evars", "check"),
    [
        # A template where a node name goes: matched as text, refused, never run.
        ("drain_nodes", {"slurmedic_nodes": [JINJA], "slurmedic_reason": "slurmedic: x y"},
         "Check the request's values"),
        ("drain_nodes", {"slurmedic_nodes": ["gpu01"], "slurmedic_reason": f"slurmedic: {JINJA}"},
         "Check the request's values"),
        # A string where a list goes (validate_argument_spec would split it at commas).
        ("drain_nodes", {"slurmedic_nodes": "gpu01", "slurmedic_reason": "slurmedic: 1.0 x"},
         "Check the request's values"),
        ("resume_nodes", {"slurmedic_nodes": "gpu01,gpu02"}, "Check the request's values"),
        # `$` would match before a trailing newline; the patterns end in \Z.
        ("drain_nodes", {"slurmedic_nodes": ["gpu01\n"], "slurmedic_reason": "slurmedic: 1.0 x"},
         "Check the request's values"),
        ("requeue_job", {"slurmedic_job": "2461\n", "slurmedic_attempt": 0,
                         "slurmedic_exclude": [], "unsafe": False}, "Check the request's values"),
        ("requeue_job", {"slurmedic_job": 7, "slurmedic_attempt": 0, "slurmedic_exclude": [],
                         "slurmedic_readmit": [JINJA]}, "Check the request's values"),
        ("requeue_job", {"slurmedic_job": 7, "slurmedic_attempt": 0, "slurmedic_exclude": [],
                         "slurmedic_readmit": "gpu01,gpu02"}, "Check the request's values"),
        ("stop_job", {"slurmedic_job": 7, "slurmedic_attempt": "0\n", "unsafe": False},
         "Check the request's values"),
        ("drain_nodes", {"slurmedic_reason": "slurmedic: 1.0 x"}, "Check the request's values"),
        ("stop_job", {"slurmedic_job": "seven", "slurmedic_attempt": 0},
         "Check the request's values"),
        # Of a type the argument spec refuses.
        ("drain_nodes", {"slurmedic_nodes": ["gpu01"], "slurmedic_reason": "slurmedic: 1.0 x",
                         "slurmedic_slurm_env": ["SLURM_CONF"]}, "Check the request's types"),
        ("collect_diagnostics", {"slurmedic_nodes": ["gpu01"], "slurmedic_incident": JINJA},
         "Check the node names and the incident"),
    ],
)  # fmt: skip
def test_a_bad_request_fails_in_the_checks_and_is_never_templated(
    tmp_path: Path, playbook: str, evars: dict[str, Any], check: str
) -> None:
    unsafe = evars.pop("unsafe", True)
    rc, failed, output = run(tmp_path, playbook, evars, unsafe=unsafe)
    assert rc != 0
    assert failed == [check], output[-3000:]
    assert not (tmp_path / MARK).exists()


def test_a_good_request_passes_the_checks(tmp_path: Path) -> None:
    # A node named by digits alone is a node name too (Ansible reads it as a number).
    evars = {"slurmedic_nodes": ["gpu01", "123"], "slurmedic_reason": "slurmedic: 1.0 hw"}
    rc, failed, output = run(tmp_path, "drain_nodes", evars)
    # No Slurm here: the first command fails, after both checks passed.
    assert rc != 0 and failed == ["Read the nodes' state"], output[-3000:]
