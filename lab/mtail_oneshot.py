"""The real mtail, run one-shot over log files: what the mtail program tests and bench use.

The mtail is the one of the lab's stack (SLURMEDIC_LAB_STACK: the host's `mtail`, or the stack's
through `slurmedic lab exec`, which sees the temporary directory), or the command named by
SLURMEDIC_MTAIL (e.g. `SLURMEDIC_MTAIL=/path/to/mtail-3.2`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from lab import stacks
from lab.config import LabConfig
from webhook import resources

PROGS = resources.MTAIL_PROGRAMS

# A sample of training_log_*: (metric name, slurm_job_id, node, rank, xid or "").
Key = tuple[str, str, str, str, str]


def command() -> list[str]:
    if os.environ.get("SLURMEDIC_MTAIL"):
        return shlex.split(os.environ["SLURMEDIC_MTAIL"])
    stack = LabConfig(run_dir=Path(tempfile.gettempdir())).stack
    if stacks.get(stack).is_host:
        return ["mtail"]
    return [sys.executable, "-m", "webhook.cli", "lab", "exec", stack, "mtail"]


def version() -> str:
    out = subprocess.run([*command(), "--version"], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).strip().splitlines()[0]


def run(logs: Path, progs: Path = PROGS, timeout: float = 60) -> str:
    """mtail's metrics (Prometheus text) after it read every `*.out` file in `logs` once."""
    out = subprocess.run(
        [
            *command(),
            # One-shot mtail still serves HTTP: on a port of its own, not :3903 (the lab's mtail).
            "--port=0",
            "--address=127.0.0.1",
            f"--progs={progs}",
            f"--logs={logs}/*.out",
            "--one_shot",
            "--one_shot_format=prometheus",
            "--logtostderr",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    if "compile failed" in out.stderr:
        raise RuntimeError(out.stderr)
    return out.stdout


def samples(text: str) -> dict[Key, float]:
    """The non-zero training_log_* samples of mtail's output."""
    found = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("training_log_") and s.value:
                labels = s.labels
                key = (s.name, labels["slurm_job_id"], labels["node"], labels["rank"])
                found[(*key, labels.get("xid", ""))] = s.value
    return found
