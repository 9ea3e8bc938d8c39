"""Run one of slurmedic's playbooks with ansible-runner and say what it did (or would do).

Each run gets a fresh private data directory: ansible-runner keeps `cmdline` and extravars in
`<dir>/env/` and a later run in the same directory silently reuses them (a real run once became
a check run, shared/reference/lab.md). Extra vars are validated here, again, before they reach
a playbook; playbooks hand them to Slurm as argv, never through a shell.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import ansible_runner
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
INVENTORY = REPO / "inventory" / "hosts.yml"

NodeName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class _Vars(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    slurmedic_slurm_env: dict[str, str] = {}


class DrainVars(_Vars):
    slurmedic_nodes: list[NodeName] = Field(min_length=1)
    slurmedic_reason: str = Field(pattern=r"^slurmedic: [A-Za-z0-9:._ -]{1,120}$")


class ResumeVars(_Vars):
    slurmedic_nodes: list[NodeName] = Field(min_length=1)


class RequeueVars(_Vars):
    slurmedic_job: int = Field(ge=1, lt=10**10)
    slurmedic_attempt: int = Field(ge=0, lt=10**6)
    slurmedic_exclude: list[NodeName] = []


class StopVars(_Vars):
    slurmedic_job: int = Field(ge=1, lt=10**10)
    slurmedic_attempt: int = Field(ge=0, lt=10**6)


class DiagnosticsVars(_Vars):
    slurmedic_nodes: list[NodeName] = Field(min_length=1)
    slurmedic_incident: str = Field(pattern=r"^[A-Za-z0-9:._#-]{1,64}$")
    slurmedic_tail_lines: int = Field(default=200, ge=1, le=10000)


PLAYBOOK_VARS: dict[str, type[_Vars]] = {
    "collect_diagnostics": DiagnosticsVars,
    "drain_nodes": DrainVars,
    "resume_nodes": ResumeVars,
    "requeue_job": RequeueVars,
    "stop_job": StopVars,
}


@dataclass
class RunResult:
    playbook: str
    check: bool
    status: str  # successful | failed | timeout | canceled
    rc: int
    commands: list[str] = field(default_factory=list)  # what it ran, or would run in check mode
    changed: list[str] = field(default_factory=list)  # tasks that changed something
    output: str = ""
    # collect_diagnostics: what each host handed back, and the hosts that could not be reached
    diagnostics: dict[str, dict[str, Any]] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)
    attempts: list[str] = field(default_factory=list)  # one per try, when retried

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0

    def summary(self) -> dict[str, Any]:
        return {
            "playbook": self.playbook,
            "check": self.check,
            "status": self.status,
            "rc": self.rc,
            "commands": self.commands,
            "changed": self.changed,
            "output": self.output[-4000:],  # the tail is what explains a failure
            **({"attempts": self.attempts} if len(self.attempts) > 1 else {}),
        }


def run_playbook(
    name: str,
    extravars: dict[str, Any],
    *,
    check: bool,
    inventory: Path = INVENTORY,
    timeout: int = 120,
) -> RunResult:
    """Validate `extravars` for playbook `name`, run it (in check mode if asked), report."""
    model = PLAYBOOK_VARS[name]
    evars = model.model_validate(extravars).model_dump()
    workdir = Path(tempfile.mkdtemp(prefix="slurmedic-run-"))
    bin_dir = str(Path(sys.executable).parent)  # ansible-runner needs ansible-playbook on PATH
    try:
        r = ansible_runner.run(
            private_data_dir=str(workdir),
            playbook=str(PLAYBOOKS / f"{name}.yml"),
            inventory=str(inventory),
            extravars=evars,
            cmdline="--check" if check else None,
            envvars={
                "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_RETRY_FILES_ENABLED": "0",
            },
            quiet=True,
            timeout=timeout,
        )
        result = RunResult(name, check, str(r.status), int(r.rc or 0))
        for ev in r.events:
            data = ev.get("event_data", {})
            host = str(data.get("host"))
            if ev.get("event") == "runner_on_unreachable" and host not in result.unreachable:
                result.unreachable.append(host)
            if ev.get("event") != "runner_on_ok":
                continue
            res = data.get("res", {})
            if data.get("task") == "Commands":
                result.commands = [str(c) for c in res.get("slurmedic_commands", [])]
            if data.get("task") == "Diagnostics":
                result.diagnostics[str(data.get("host"))] = res.get("slurmedic_diagnostics", {})
            if res.get("changed"):
                result.changed.append(str(data.get("task")))
        result.output = r.stdout.read() if r.stdout else ""
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
