"""The names that may reach a command line, as the playbooks define them.

The playbooks check their extra vars against playbooks/vars/slurmedic.yml; the core reads the
same file once, at import, so what the core accepts as a node name or a job id is exactly what a
playbook's own check accepts. (The one read of a file in the core: a resource, not an input.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from webhook import resources


def playbook_vars_file() -> Path:
    """Where the playbooks' shared vars live."""
    return resources.PLAYBOOKS / "vars" / "slurmedic.yml"


def _pattern(values: dict[str, Any], key: str) -> re.Pattern[str]:
    value = values.get(key)
    if not isinstance(value, str):
        raise RuntimeError(f"{playbook_vars_file()}: {key} is missing or not a string")
    return re.compile(value)


_VARS: dict[str, Any] = yaml.safe_load(playbook_vars_file().read_text()) or {}
# Slurm node names that may reach a command line: letters, digits, dot, dash, underscore.
NODE_NAME = _pattern(_VARS, "slurmedic_node_name_pattern")
JOB_ID = _pattern(_VARS, "slurmedic_job_id_pattern")
# What else the playbooks check: a drain reason, an incident key (the runner checks them first).
DRAIN_REASON = _pattern(_VARS, "slurmedic_reason_pattern")
INCIDENT = _pattern(_VARS, "slurmedic_incident_pattern")
# A replica's fence file (webhook/executor/fence.py): an absolute path of plain characters.
FENCE = _pattern(_VARS, "slurmedic_fence_pattern")
# One element of a health check's command (argv): printable ASCII, no newline.
ARGV = _pattern(_VARS, "slurmedic_argv_pattern")


def check_argv(argv: list[str]) -> list[str]:
    """A command given as an argv (never a shell line), as the playbooks' own check takes it:
    its parts as they are, or ValueError naming the first that is not one."""
    for part in argv:
        if not ARGV.match(part):
            raise ValueError(f"{part[:40]!r}: printable characters only, 1 to 256, no newline")
    return argv
