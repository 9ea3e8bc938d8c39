"""Run one of slurmedic's playbooks with ansible-runner and say what it did (or would do).

Each run gets a fresh private data directory: ansible-runner keeps `cmdline` and extravars in
`<dir>/env/` and a later run in the same directory silently reuses them (a real run once became
a check run, docs/lab.md). Extra vars are validated here, again, before they reach
a playbook; playbooks hand them to Slurm as argv, never through a shell.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import ansible_runner
import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from webhook import resources
from webhook.core.patterns import ARGV, DRAIN_REASON, FENCE, INCIDENT, NODE_NAME
from webhook.executor import cgroup
from webhook.executor.cgroup import RunGroup

PLAYBOOKS = resources.PLAYBOOKS
INVENTORY = resources.INVENTORY

SET_STATS = ("ansible.builtin.set_stats", "set_stats")
ACT = "slurmedic_act"  # playbooks/library/slurmedic_act.py: every command that changes Slurm
OUTCOMES = ("runner_on_ok", "runner_on_failed")

NodeName = Annotated[str, StringConstraints(pattern=NODE_NAME.pattern)]
ArgvElement = Annotated[str, StringConstraints(pattern=ARGV.pattern)]


class _Vars(BaseModel):
    # Python's re, as the playbooks' checks: the patterns are theirs (\Z-anchored).
    model_config = ConfigDict(extra="forbid", frozen=True, regex_engine="python-re")
    slurmedic_slurm_env: dict[str, str] = {}
    # The replica's fence file (webhook/executor/fence.py); None: no fence
    slurmedic_fence: Annotated[str, StringConstraints(pattern=FENCE.pattern)] | None = None


class DrainVars(_Vars):
    slurmedic_nodes: list[NodeName] = Field(min_length=1)
    slurmedic_reason: str = Field(pattern=DRAIN_REASON.pattern)


class ResumeVars(_Vars):
    slurmedic_nodes: list[NodeName] = Field(min_length=1)


class RequeueVars(_Vars):
    slurmedic_job: int = Field(ge=1, lt=10**10)
    slurmedic_attempt: int = Field(ge=0, lt=10**6)
    slurmedic_exclude: list[NodeName] = []
    slurmedic_readmit: list[NodeName] = []


class StopVars(_Vars):
    slurmedic_job: int = Field(ge=1, lt=10**10)
    slurmedic_attempt: int = Field(ge=0, lt=10**6)


class DiagnosticsVars(_Vars):
    slurmedic_nodes: list[NodeName] = Field(min_length=1)
    slurmedic_incident: str = Field(pattern=INCIDENT.pattern)
    slurmedic_tail_lines: int = Field(default=200, ge=1, le=10000)


class ResetVars(_Vars):
    slurmedic_nodes: list[NodeName] = Field(min_length=1)
    slurmedic_incident: str = Field(pattern=INCIDENT.pattern)


class RebootVars(_Vars):
    slurmedic_nodes: list[NodeName] = Field(min_length=1)
    slurmedic_reason: str = Field(pattern=DRAIN_REASON.pattern)


class HealthCheckVars(_Vars):
    slurmedic_nodes: list[NodeName] = Field(min_length=1)
    slurmedic_incident: str = Field(pattern=INCIDENT.pattern)
    # The policy's command; a node's inventory may name its own (slurmedic_health_check), which
    # then wins: an extra var of the same name would override every inventory's.
    slurmedic_health_check_default: list[ArgvElement] = Field(min_length=1, max_length=32)
    # A DCGM diagnostic at level 2 takes minutes; level 3 and 4 take longer.
    slurmedic_health_check_timeout: int = Field(default=1800, ge=1, le=86400)


PLAYBOOK_VARS: dict[str, type[_Vars]] = {
    "collect_diagnostics": DiagnosticsVars,
    "drain_nodes": DrainVars,
    "resume_nodes": ResumeVars,
    "requeue_job": RequeueVars,
    "stop_job": StopVars,
    "reset_gpu": ResetVars,
    "reboot_nodes": RebootVars,
    "health_check": HealthCheckVars,
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
    # requeue_job: where a successor Slurm had already started by itself runs (checked clear of
    # the implicated nodes), when there was nothing left to requeue
    successor_nodes: list[str] = field(default_factory=list)
    # Slurm's state as the playbook read it (nodes' states; the job's state, restarts and
    # exclusion): what its commands change, before -> after (webhook/core/changes.py)
    before: dict[str, Any] = field(default_factory=dict)
    # ... and as it read it once done (drain_nodes, requeue_job): what webhook/core/outcome.py
    # checks against the decision
    after: dict[str, Any] = field(default_factory=dict)
    # Each act's time from its last check (the fence, Slurm's state) to its command's end, ms
    windows: list[float] = field(default_factory=list)
    fenced: bool = False  # an act refused: the replica's term may have ended
    # reset_gpu, health_check: each node's {"rc": int, "output": str} (the output's last 200
    # lines). rc -1: nothing was run there (not due, unreachable, not in the inventory), the
    # output saying why. A check that passed has rc 0. Real runs only: check mode runs neither.
    reset: dict[str, dict[str, Any]] = field(default_factory=dict)
    health: dict[str, dict[str, Any]] = field(default_factory=dict)

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
            **({"successor_nodes": self.successor_nodes} if self.successor_nodes else {}),
            **({"before": self.before} if self.before else {}),
            **({"after": self.after} if self.after else {}),
            **({"windows_ms": self.windows} if self.windows else {}),
            **({"fenced": True} if self.fenced else {}),
            # The rc of each node's reset or check; their outputs are kept as artifacts.
            **({"reset": {n: r["rc"] for n, r in self.reset.items()}} if self.reset else {}),
            **({"health": {n: r["rc"] for n, r in self.health.items()}} if self.health else {}),
        }


def reported(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What the playbook reported with `set_stats` (per_host: false): ansible-runner's callback
    puts it in the playbook_on_stats event's artifact_data. The playbooks report their results
    this way so that nothing here depends on what their tasks are called."""
    events = list(events)
    for ev in events:
        if ev.get("event") == "playbook_on_stats":
            data = ev.get("event_data", {}).get("artifact_data")
            return data if isinstance(data, dict) else {}
    # A run cut short (its timeout) ends before the stats: then what its set_stats tasks had
    # reported so far, merged as Ansible merges them (the playbooks aggregate only mappings).
    found: dict[str, Any] = {}
    for ev in events:
        data = ev.get("event_data", {})
        if ev.get("event") != "runner_on_ok" or data.get("task_action") not in SET_STATS:
            continue
        stats = data.get("res", {}).get("ansible_stats", {})
        for key, value in (stats.get("data") or {}).items():
            before = found.get(key)
            merge = stats.get("aggregate", True) and isinstance(value, dict)
            found[key] = {**before, **value} if merge and isinstance(before, dict) else value
    return found


class _Unsafe(str):
    """A string Ansible must never template, on its own (YAML `!unsafe`)."""


class _UnsafeMap(dict[str, Any]):
    """A mapping Ansible must never template, nor anything it holds: one `!unsafe` over the
    whole, not one per string. Ansible (2.19) resolves the scalar under an `!unsafe` tag again
    as if unquoted (`!unsafe "02"` is the number 2, `!unsafe "true"` a boolean), while the
    quoted strings inside a tagged mapping stay strings and are data all the same (a health
    check's argv keeps its "2")."""


class _UnsafeList(list[Any]):
    """A list as _UnsafeMap."""


class _UnsafeDumper(yaml.SafeDumper):
    """Double-quoted scalars: escapes (`\\n`) say exactly what a string holds, where the
    folding of a quoted multi-line scalar differs between YAML parsers (libyaml, Ansible's,
    gave "2461" for "2461\\n" written single-quoted)."""


_UnsafeDumper.add_representer(
    _Unsafe, lambda dumper, value: dumper.represent_scalar("!unsafe", str(value), style='"')
)
_UnsafeDumper.add_representer(
    str, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
)
_UnsafeDumper.add_representer(
    _UnsafeMap, lambda dumper, value: dumper.represent_mapping("!unsafe", dict(value))
)
_UnsafeDumper.add_representer(
    _UnsafeList, lambda dumper, value: dumper.represent_sequence("!unsafe", list(value))
)


def untrusted(value: Any) -> Any:
    """`value` tagged `!unsafe` as one node when dumped with _UnsafeDumper: everything in it is
    data to Ansible, never a template."""
    if isinstance(value, str):
        return _Unsafe(value)
    if isinstance(value, dict):
        return _UnsafeMap(value)
    if isinstance(value, list | tuple):
        return _UnsafeList(value)
    return value


class CannotRun(Exception):
    """This host could not prepare or record a playbook run (its disk full, its temp dir not
    writable). What the playbook did, if it started, is unknown: as after a crash, the run is
    left `running` for a leader that can run it again (the playbooks are idempotent)."""


def run_playbook(
    name: str,
    extravars: dict[str, Any],
    *,
    check: bool,
    inventory: Path = INVENTORY,
    timeout: int = 120,
    playbooks: Path | None = None,
    group: RunGroup | None = None,
) -> RunResult:
    """Validate `extravars` for playbook `name`, run it (in check mode if asked, in the runs'
    cgroup if given one), report."""
    model = PLAYBOOK_VARS[name]
    evars = model.model_validate(extravars).model_dump(exclude_none=True)
    try:
        return _run(
            name,
            evars,
            check=check,
            inventory=inventory,
            timeout=timeout,
            playbooks=playbooks,
            group=group,
        )
    except OSError as e:
        raise CannotRun(f"{name}: {e.strerror or e} ({tempfile.gettempdir()})") from e


def _run(
    name: str,
    evars: dict[str, Any],
    *,
    check: bool,
    inventory: Path,
    timeout: int,
    playbooks: Path | None,
    group: RunGroup | None,
) -> RunResult:
    workdir = Path(tempfile.mkdtemp(prefix="slurmedic-run-"))
    bin_dir = str(Path(sys.executable).parent)  # ansible-runner needs ansible-playbook on PATH
    try:
        # Every string tagged !unsafe: a value is data to the playbook, never a template (in
        # ansible-core, a plain extra var is templated wherever it is used, its checks too).
        vars_file = workdir / "slurmedic-vars.yml"
        vars_file.write_text(yaml.dump(untrusted(evars), Dumper=_UnsafeDumper))
        vars_file.chmod(0o600)
        playbook = str((playbooks or PLAYBOOKS) / f"{name}.yml")
        args = [*(["--check"] if check else []), "--extra-vars", f"@{vars_file}"]
        wrap: dict[str, str] = {}
        if group is not None:
            # ansible-runner runs `binary` as given, with the playbook left to the arguments.
            wrap = {"binary": sys.executable}
            args = [*cgroup.command(group)[1:], str(Path(bin_dir) / "ansible-playbook"), *args]
            args.append(playbook)
        r = ansible_runner.run(
            private_data_dir=str(workdir),
            playbook=playbook,
            inventory=str(inventory),
            cmdline=shlex.join(args),
            **wrap,
            envvars={
                "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_RETRY_FILES_ENABLED": "0",
            },
            quiet=True,
            timeout=timeout,
        )
        result = RunResult(name, check, str(r.status), int(r.rc or 0))
        events = list(r.events)
        for ev in events:
            data = ev.get("event_data", {})
            host = str(data.get("host"))
            if ev.get("event") == "runner_on_unreachable" and host not in result.unreachable:
                result.unreachable.append(host)
            if ev.get("event") == "runner_on_ok" and data.get("res", {}).get("changed"):
                result.changed.append(str(data.get("task")))
            if data.get("task_action") == ACT and ev.get("event") in OUTCOMES:
                res = data.get("res", {})
                if isinstance(res.get("window_ms"), int | float):
                    result.windows.append(float(res["window_ms"]))
                result.fenced = result.fenced or bool(res.get("fenced"))
        take_stats(result, reported(events))
        result.output = r.stdout.read() if r.stdout else ""
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def take_stats(result: RunResult, stats: dict[str, Any]) -> None:
    """Fill `result` from what its playbook reported (`reported`)."""
    result.commands = [str(c) for c in stats.get("slurmedic_commands", [])]
    result.successor_nodes = [str(n) for n in stats.get("slurmedic_successor_nodes", [])]
    before = stats.get("slurmedic_before", {})
    result.before = {str(k): str(v) for k, v in before.items()} if isinstance(before, dict) else {}
    after = stats.get("slurmedic_after", {})
    result.after = after if isinstance(after, dict) else {}
    diagnostics = stats.get("slurmedic_diagnostics", {})
    result.diagnostics = {str(h): d for h, d in diagnostics.items() if isinstance(d, dict)}
    result.reset = node_results(stats.get("slurmedic_reset"))
    result.health = node_results(stats.get("slurmedic_health"))


def node_results(value: Any) -> dict[str, dict[str, Any]]:
    """{node: {"rc": int, "output": str}} from a playbook's per-node stats: an rc that is no
    number (a playbook's mistake) reads as -1, as a command that never ran."""
    if not isinstance(value, dict):
        return {}
    found: dict[str, dict[str, Any]] = {}
    for node, res in value.items():
        if not isinstance(res, dict):
            continue
        rc = res.get("rc")
        try:
            code = int(str(rc).strip()) if not isinstance(rc, bool) else -1
        except ValueError:
            code = -1
        found[str(node)] = {"rc": code, "output": str(res.get("output") or "")}
    return found
