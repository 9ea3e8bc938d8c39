#!/usr/bin/python
"""slurmedic_act: one Slurm command that changes something, run only if it is still due.

Every playbook reads Slurm, plans, then acts. A pause between the read and the act (a VM
paused, a stopped process tree, a long garbage collection) turns the read stale, and Slurm's
commands take no precondition: `scontrol requeuehold` requeues whatever attempt now runs. So
each act is run by this module, which in one process and immediately before the command
  1. refuses if the term of the leader that decided it may have ended (`not_after`, from the
     replica's fence file: epoch seconds until which its lease surely holds; webhook/executor/
     fence.py);
  2. reads the object again (`read`: `scontrol show ... --oneliner`) and runs nothing unless
     every record it shows still matches `expect` (field: regular expression, matched whole):
     the attempt the action was decided for, the state the plan saw;
  3. checks the fence again, and runs `act` (argv, never a shell), for at most `timeout`
     seconds if given (a GPU reset can hang on a GPU that fell off the bus).
The module runs where its task runs: on a compute node (reset_gpu.yml) its `read` runs there
too, with the node's own Slurm client commands.
What remains is the time from that last check until slurmctld has the command (`window_ms`,
reported): Slurm offers no conditional requeue, drain or cancel to close it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule  # type: ignore[import-untyped]

DOCUMENTATION = r"""
module: slurmedic_act
short_description: Run a Slurm command only while it is still due and its leader's term holds
options:
  act: {description: the command (argv), type: list, elements: str, required: true}
  read: {description: "scontrol show ... --oneliner (argv)", type: list, elements: str}
  expect: {description: "field: regex each record read must match whole", type: dict}
  not_after: {description: "epoch seconds; empty: no fence", type: str, default: ""}
  tolerate: {description: "regex: a refusal on stderr that is not a failure", type: str}
  on_stale: {description: "a record not as expected: skip the act, or fail", type: str,
             choices: [skip, fail], default: skip}
  timeout: {description: "seconds the act may take; 0: no limit", type: int, default: 0}
"""

# `Key=value` in scontrol's --oneliner output; a value runs to the next key (node reasons hold
# spaces; a key starts after whitespace, so `TRES=cpu=1,mem=4G` is one value).
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.]*)=")


def fields(line: str) -> dict[str, str]:
    keys = list(_KEY.finditer(line))
    found: dict[str, str] = {}
    for i, key in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        found.setdefault(key.group(1), line[key.end() : end].strip())
    return found


def _fenced(not_after: str) -> str | None:
    if not not_after:
        return None
    now = time.time()
    if now < float(not_after):
        return None
    return (
        f"fenced: the term that decided this may have ended ({now - float(not_after):.3f} s "
        "past its lease); nothing was run"
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "act": {"type": "list", "elements": "str", "required": True},
            "read": {"type": "list", "elements": "str"},
            "expect": {"type": "dict", "default": {}},
            "not_after": {"type": "str", "default": ""},
            "tolerate": {"type": "str"},
            "on_stale": {"type": "str", "choices": ["skip", "fail"], "default": "skip"},
            "timeout": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        # As a skipped command in a dry run: nothing changed, and the tasks after it go on
        # as after an act (the plan's commands are what a dry run records).
        module.exit_json(changed=False, acted=True, msg="check mode: nothing run")
    if why := _fenced(p["not_after"]):
        module.fail_json(msg=why, fenced=True, acted=False)
    records: list[dict[str, str]] = []
    if p["read"]:
        read = subprocess.run(p["read"], capture_output=True, text=True, check=False)
        if read.returncode != 0:
            module.fail_json(msg=f"reading before the act failed: {read.stderr.strip()}")
        records = [fields(line) for line in read.stdout.splitlines() if line.strip()]
    for record in records:
        for key, pattern in (p["expect"] or {}).items():
            value = record.get(key)
            if value is None or not re.fullmatch(str(pattern), value):
                stale = f"changed since it was read: {key}={value}, not {pattern}; not run"
                if p["on_stale"] == "fail":
                    module.fail_json(msg=stale, stale=stale, acted=False, found=record)
                module.exit_json(changed=False, acted=False, stale=stale, found=record)
    if why := _fenced(p["not_after"]):
        module.fail_json(msg=why, fenced=True, acted=False)
    checked = time.monotonic()
    # A session of its own: at its timeout the command is killed with whatever it started
    # (which would otherwise hold its output open).
    try:
        act = subprocess.Popen(
            p["act"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as e:  # not installed where the task runs (a node without nvidia-smi)
        module.fail_json(msg=f"{p['act'][0]} could not be run: {e}", acted=False, cmd=p["act"])
    try:
        stdout, stderr = act.communicate(timeout=p["timeout"] or None)
    except subprocess.TimeoutExpired:
        os.killpg(act.pid, signal.SIGKILL)
        stdout, stderr = act.communicate()
        module.fail_json(
            msg=f"{p['act'][0]} did not end within {p['timeout']} s: killed",
            acted=True,  # it ran, and may have changed something before it was killed
            timed_out=True,
            cmd=p["act"],
            stdout=stdout,
            stderr=stderr,
        )
    window_ms = round((time.monotonic() - checked) * 1000, 1)
    result = {
        "returncode": act.returncode,  # not `rc`: Ansible fails any result whose rc is not 0
        "stdout": stdout,
        "stderr": stderr,
        "cmd": p["act"],
        "window_ms": window_ms,
    }
    if act.returncode == 0:
        module.exit_json(changed=True, acted=True, **result)
    if p["tolerate"] and re.search(p["tolerate"], stderr):
        module.exit_json(changed=False, acted=False, **result)
    module.fail_json(msg=f"{p['act'][0]} failed: {stderr.strip()}", acted=False, **result)


if __name__ == "__main__":
    main()
