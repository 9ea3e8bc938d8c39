"""`scontrol` and `scancel` over slurmrestd: the few commands slurmedic's playbooks run, for a
host with no Slurm commands and no munge key (`cluster.slurm: rest`, beside Slinky).

The playbooks read Slurm with `scontrol show node|job ... --oneliner` and act with `scontrol
update`, `requeuehold`, `release`, `reboot` and `scancel`; their checks, plans and fencing
(library/slurmedic_act.py) read those commands' fields. Over REST the executor puts this
module first on the playbooks' PATH as `scontrol` and `scancel` (`command_dir`), so the same
playbooks, their check mode and the commands their dry runs record stay as they are, and each
command becomes one REST call per object:

| command | REST call (`/slurm/v0.0.NN`) | since |
|---|---|---|
| `show node N --oneliner` | `GET /node/N` | all |
| `show job J --oneliner` | `GET /job/J` | all |
| `update nodename=N state=drain reason=R` | `POST /node/N {"state":["DRAIN"],"reason":R}` | .39 |
| `update nodename=N state=resume` | `POST /node/N {"state": ["RESUME"]}` | .39 |
| `update jobid=J ExcNodeList=L` | `POST /job/J {"excluded_nodes": L}` | all |
| `release J` | `POST /job/J {"hold": false}` | all |
| `requeuehold J` | `GET /job/J/requeue?flags=Hold` | .45 |
| `scancel J` | `DELETE /job/J` (SIGKILL: a cancel) | all |
| `reboot ...` | none: slurmrestd has no reboot | none |

(v0.0.39 is Slurm 23.02's, v0.0.45 26.05's: 22.05 cannot drain over REST, 24.11 cannot requeue.)

A command an API lacks fails with one line saying which release has it. Only the fields the
playbooks read are printed, as scontrol prints them: `NodeName`, `Gres`, `State` (base state,
then its flags, `+`-joined), `Reason` (with ` [user@time]`); `JobId`, `JobState` (the first
flag by Slurm's order, else the base state), `Reason` (the description, spaces as `_`, else
the reason code), `Requeue`, `Restarts`, `NodeList`, `ExcNodeList`, `ExitCode`. The lab holds them
against scontrol's own on every stack (tests/lab/test_rest_commands.py).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hostlist

from webhook.adapters.slurm import SlurmError, flag, job_state, names, node_state, number
from webhook.adapters.slurmrest import SlurmRest, version
from webhook.core.patterns import NODE_NAME

# Where the executor passes slurmrestd's settings (cluster.rest, as JSON) to the playbooks.
ENV = "SLURMEDIC_SLURMREST"
COMMANDS = ("scontrol", "scancel")
# The first API version with each act (22.05's v0.0.38 has no node update, 24.11's none a
# requeue).
NODE_UPDATE_SINCE = 39
REQUEUE_SINCE = 45


def acts(api: str) -> tuple[list[str], list[str]]:
    """What the playbooks can and cannot do over slurmrestd's API version `api` (v0.0.NN)."""
    number = version(api)
    can: list[str] = []
    cannot: list[str] = []
    for act, since in (("drain", NODE_UPDATE_SINCE), ("resume", NODE_UPDATE_SINCE),
                       ("requeue", REQUEUE_SINCE)):  # fmt: skip
        (can if number >= since else cannot).append(act)
    return [*can, "stop", "release", "exclude nodes"], [*cannot, "reboot"]


class Usage(SlurmError):
    """A command line this stand-in does not take."""


def client_from_env(env: Mapping[str, str], own_dir: Path | None = None) -> SlurmRest:
    """The client ENV describes (SlurmRest.settings). A token command runs with `own_dir`
    (where these stand-ins are) left off PATH: `scontrol token` is the real scontrol's."""
    raw = env.get(ENV)
    if not raw:
        raise SlurmError(f"{ENV} is not set: the executor sets it when cluster.slurm is rest")
    path = [p for p in env.get("PATH", os.defpath).split(os.pathsep)
            if own_dir is None or Path(p) != own_dir]  # fmt: skip
    try:
        return SlurmRest.from_settings(raw, {"PATH": os.pathsep.join(path)})
    except ValueError as e:
        raise SlurmError(f"{ENV}: {e}") from e


# ---- the commands -------------------------------------------------------------------------
def run(prog: str, args: Sequence[str], rest: SlurmRest) -> str:
    """What `prog args` prints, done over `rest`; SlurmError (or Usage) when it fails."""
    if prog == "scancel":
        if len(args) != 1 or not args[0].isdigit():
            raise Usage("scancel over slurmrestd takes one job id")
        _act(rest, "DELETE", f"/job/{args[0]}")
        return ""
    if not args:
        raise Usage("scontrol over slurmrestd: no command")
    verb, rest_args = args[0].lower(), list(args[1:])
    if verb == "show":
        return _show(rest, rest_args)
    if verb == "update":
        _update(rest, _settings(rest_args))
        return ""
    if verb in ("requeuehold", "release"):
        if len(rest_args) != 1 or not rest_args[0].isdigit():
            raise Usage(f"scontrol {verb} over slurmrestd takes one job id")
        job = rest_args[0]
        if verb == "release":
            _act(rest, "POST", f"/job/{job}", {"hold": False})
        else:
            _need(rest, REQUEUE_SINCE, "requeue", "Slurm 26.05 (v0.0.45)")
            _act(rest, "GET", f"/job/{job}/requeue?flags=Hold")
        return ""
    if verb == "reboot":
        raise SlurmError(
            "slurmrestd has no reboot: over REST slurmedic cannot reboot nodes "
            "(policy repairs.reboot: false sends what a reboot mends to a person)"
        )
    raise Usage(f"scontrol {verb} is not one of the commands slurmedic runs over slurmrestd")


def _show(rest: SlurmRest, args: list[str]) -> str:
    args = [a for a in args if a not in ("--oneliner", "-o")]
    if len(args) != 2:
        raise Usage("scontrol show over slurmrestd takes: node|job|hostnames NAME")
    what, name = args[0].lower(), args[1]
    if what == "hostnames":
        return "".join(f"{n}\n" for n in _expand(name))
    if what == "node":
        return "".join(node_line(_one(rest, f"/node/{n}", "nodes")) + "\n" for n in _expand(name))
    if what == "job":
        if not name.isdigit():
            raise Usage("scontrol show job over slurmrestd takes a job id")
        return job_line(_one(rest, f"/job/{name}", "jobs")) + "\n"
    raise Usage(f"scontrol show {what} is not one slurmedic reads over slurmrestd")


def _settings(args: list[str]) -> dict[str, str]:
    """`key=value` words, keys lower case (scontrol's keys are case-insensitive)."""
    found = {}
    for a in args:
        key, eq, value = a.partition("=")
        if not eq:
            raise Usage(f"scontrol update over slurmrestd: {a[:60]!r} is no key=value")
        found[key.lower()] = value
    return found


def _update(rest: SlurmRest, settings: dict[str, str]) -> None:
    if "nodename" in settings:
        state = settings.pop("state", "").lower()
        reason = settings.pop("reason", "")
        nodes = _expand(settings.pop("nodename"))
        if settings or state not in ("drain", "resume") or (state == "drain" and not reason):
            raise Usage("scontrol update over slurmrestd takes nodename= state=drain reason= "
                        "or nodename= state=resume")  # fmt: skip
        _need(rest, NODE_UPDATE_SINCE, "node update", "Slurm 23.02 (v0.0.39)")
        body: dict[str, Any] = {"state": [state.upper()]}
        if reason:
            body["reason"] = reason
        for node in nodes:
            _act(rest, "POST", f"/node/{node}", body)
        return
    job = settings.pop("jobid", "")
    if job.isdigit() and set(settings) == {"excnodelist"}:
        excluded = settings["excnodelist"]
        if excluded:
            _expand(excluded)  # names only, as scontrol takes them
        _act(rest, "POST", f"/job/{job}", {"excluded_nodes": excluded})
        return
    raise Usage("scontrol update over slurmrestd takes nodename=... or jobid=... ExcNodeList=...")


def _need(rest: SlurmRest, since: int, what: str, release: str) -> None:
    if version(rest.api()) < since:
        raise SlurmError(
            f"slurmrestd {rest.api()} has no {what} ({release} and later have one): "
            "run this playbook where Slurm's commands are (cluster.slurm: cli)"
        )


def _act(rest: SlurmRest, method: str, path: str, body: Mapping[str, Any] | None = None) -> None:
    answer = rest.call(method, f"/slurm/{rest.api()}{path}", body)
    # A job update's per-job refusal comes back as a warning, not an error (slurmrestd's
    # _job_post_update): "Job update resulted in non-zero return-code".
    for w in answer.get("warnings") or []:
        said = w.get("description", "") if isinstance(w, dict) else str(w)
        if "non-zero return-code" in said:
            raise SlurmError(f"{method} {rest.url}/slurm/{rest.api()}{path}: {said}")


def _one(rest: SlurmRest, path: str, key: str) -> Mapping[str, Any]:
    answer = rest.get(f"/slurm/{rest.api()}{path}")
    rows = answer.get(key)
    if not isinstance(rows, list) or len(rows) != 1 or not isinstance(rows[0], Mapping):
        raise SlurmError(f"GET {rest.url}/slurm/{rest.api()}{path}: not one record in {key!r}")
    return rows[0]


def _expand(expr: str) -> list[str]:
    """The node names of a host list, each a node name (they go into a URL's path)."""
    try:
        found = list(hostlist.expand_hostlist(expr))
    except hostlist.BadHostlist as e:
        raise Usage(f"{expr[:60]!r} is not a host list") from e
    if not found or not all(NODE_NAME.match(n) for n in found):
        raise Usage(f"{expr[:60]!r} is not a list of node names")
    return found


# ---- scontrol's lines ---------------------------------------------------------------------
def node_line(n: Mapping[str, Any]) -> str:
    base, _ = node_state(n.get("state"), n.get("state_flags"))
    # The flags in Slurm's own order, as the JSON lists them (22.05: apart from the state).
    flags = [f for f in map(str.upper, names(n.get("state")) + names(n.get("state_flags")))
             if f != base]  # fmt: skip
    line = f"NodeName={n.get('name', '')} Gres={n.get('gres') or '(null)'} "
    line += f"State={'+'.join([base, *flags])}"
    reason = n.get("reason") or ""
    if reason:
        by = n.get("reason_set_by_user") or "root"
        at = number(n.get("reason_changed_at"))
        when = "Unknown"
        if at:
            when = datetime.fromtimestamp(at, UTC).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
        line += f" Reason={reason} [{by}@{when}]"
    return line


def job_line(j: Mapping[str, Any]) -> str:
    state, _ = job_state(j.get("job_state"))
    description = j.get("state_description") or ""
    reason = description.replace(" ", "_") if description else (j.get("state_reason") or "None")
    return " ".join([
        f"JobId={number(j.get('job_id'))}",
        f"JobState={state}",
        f"Reason={reason}",
        f"Requeue={int(flag(j.get('requeue', True)))}",
        f"Restarts={number(j.get('restart_cnt')) or 0}",
        f"ExitCode={_exit_code(j.get('exit_code'))}",
        f"NodeList={j.get('nodes') or '(null)'}",
        f"ExcNodeList={j.get('excluded_nodes') or '(null)'}",
    ])  # fmt: skip


def _exit_code(raw: Any) -> str:
    """scontrol's `code:signal`, from 22.05's wait status or 23.02+'s object."""
    if isinstance(raw, Mapping):
        code = number(raw.get("return_code")) or 0
        sig = raw.get("signal") or {}
        signal = number(sig.get("id")) if isinstance(sig, Mapping) else 0
        return f"{code}:{signal or 0}"
    status = number(raw) or 0
    return f"{status >> 8}:{status & 0x7F}"


# ---- where the playbooks find it ----------------------------------------------------------
@functools.cache
def command_dir() -> Path:
    """A directory of this process's own (mode 0700, removed when it exits) holding `scontrol`
    and `scancel` that run this module with this Python: first on the playbooks' PATH."""
    made = Path(tempfile.mkdtemp(prefix="slurmedic-rest-commands-")).resolve()
    atexit.register(shutil.rmtree, made, ignore_errors=True)
    for prog in COMMANDS:
        script = made / prog
        script.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            "from webhook.adapters.rest_commands import main\n"
            f"sys.exit(main({prog!r}, sys.argv[1:]))\n"
        )
        script.chmod(0o700)
    return made


def main(prog: str, args: Sequence[str]) -> int:
    try:
        rest = client_from_env(os.environ, Path(sys.argv[0]).resolve().parent)
        sys.stdout.write(run(prog, args, rest))
    except SlurmError as e:
        print(f"{prog} (over slurmrestd): {e}", file=sys.stderr)
        return 1
    return 0
