"""The cluster view from the real Slurm, on every release from 22.05 to 26.05.

What each release prints (measured on Debian's packages, see docs/compatibility.md):

- 22.05: `sinfo --json` has a `nodes` list, a node's `state` is a lower-case string with the
  flags apart in `state_flags`; `squeue --json` gives `job_state` as a string and times as
  integers; scontrol has no `--json`.
- 23.02 and later: `scontrol show nodes --json` and `scontrol show jobs --json` (sinfo's JSON
  became grouped records, `sinfo`); `state` and `job_state` are lists of names (base state and
  flags), times and counts are `{"set", "infinite", "number"}` objects.

The release is read from `scontrol --version` and picks the commands; each field is then read
by its shape, so a release in between (or a field that changes shape) still reads. Output that
cannot be read is one `SlurmError` naming the command and the release; the caller (the loop)
keeps its last good view.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hostlist

from webhook.adapters.slinky import pod_host
from webhook.core.cluster import (
    ENDED_STATES,
    HELD_STATES,
    JOB_BASE_STATES,
    NODE_NAME,
    ClusterView,
    Job,
    Node,
)

TIMEOUT_S = 10.0
TOPOLOGY_S = 60.0  # how long a read of the topology holds (SlurmCluster.switches)
# scontrol's --json arrived in 23.02.
SCONTROL_JSON_SINCE = (23, 2)

# The flags of a node whose reboot Slurm holds: asked for (ASAP waits for its jobs), issued.
REBOOTING = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
# Slurm's node base states (the rest of a state list are flags).
NODE_BASE_STATES = {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"}
# The order in which Slurm's job_state_string() names a job's state when flags are set: the
# first flag present wins, else the base state. squeue's %T and 22.05's JSON print this.
JOB_FLAG_ORDER = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "EXPEDITING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)


class SlurmError(RuntimeError):
    pass


@dataclass(frozen=True, order=True)
class Release:
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> Release:
        m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
        if m is None:
            raise SlurmError(f"scontrol --version: no Slurm release in {text.strip()[:80]!r}")
        return cls(int(m[1]), int(m[2]), int(m[3] or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.patch}"

    @property
    def scontrol_json(self) -> bool:
        return (self.major, self.minor) >= SCONTROL_JSON_SINCE


@dataclass(frozen=True)
class SlurmNode:
    """A node as Slurm reports it, the same on every release."""

    name: str
    base: str  # IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: frozenset[str]  # DRAIN, NOT_RESPONDING, COMPLETING, ...
    partitions: tuple[str, ...] = ()
    reason: str = ""
    reason_set_at: datetime | None = None
    gres: str = ""
    gres_used: str = ""
    # The machine it runs on when that is not its own name: on Slinky, its pod's Kubernetes node.
    host: str = ""

    @property
    def gpus(self) -> int:
        return gpu_count(self.gres)

    @property
    def state(self) -> str:
        """slurmedic's one word for it: the base state lower case, `drain` when draining or
        drained, or FAILed by an operator (out of service either way)."""
        return "drain" if self.flags & {"DRAIN", "FAIL"} else self.base.lower()

    @property
    def state_long(self) -> str:
        """sinfo's StateLong (`%T`), as Slurm's node_state_string() spells it, lower case, with
        `*` for a node that does not respond (and `+` for an allocated one completing); the
        power-saving and reboot suffixes are left out."""
        f, base = self.flags, self.base
        star = "*" if "NOT_RESPONDING" in f else ""
        busy = base in ("ALLOCATED", "MIXED") or "COMPLETING" in f
        if "INVALID_REG" in f:
            return "inval"
        if "MAINTENANCE" in f and not ("DRAIN" in f or base in ("ALLOCATED", "DOWN", "MIXED")):
            return "maint" + star
        if "DRAIN" in f:
            return ("draining" if busy else "drained") + star
        if "FAIL" in f:
            return ("failing" if busy else "fail") + star
        if base == "ALLOCATED":
            return "allocated" + (star or ("+" if "COMPLETING" in f else ""))
        if base != "DOWN" and "COMPLETING" in f:
            return "completing" + star
        if base == "IDLE" and not star:
            for flag, name in (("RESERVED", "reserved"), ("PLANNED", "planned")):
                if flag in f:
                    return name
        return base.lower() + star


@dataclass
class SlurmSnapshot:
    """One read of the cluster: release, nodes, jobs, leaf switches."""

    release: Release
    nodes: list[SlurmNode] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)  # the core's own: Slurm's fields, as read
    switches: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def view(self) -> ClusterView:
        return build_view(self)


class SlurmCluster:
    def __init__(
        self, slurm_conf: Path | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        """`env`: what the commands need on top of this process's (SLURM_CONF, PATH)."""
        self.env = {**os.environ, **(env or {})}
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = str(slurm_conf)
        self._release: Release | None = None
        self._switches: tuple[float, dict[str, tuple[str, ...]]] | None = None

    def _run(self, *argv: str) -> str:
        # Slurm's clients do not say at once that their config is missing: some look for a
        # configless controller first, for as long as DNS takes. Said here, before them.
        conf = self.env.get("SLURM_CONF")
        if conf and not Path(conf).is_file():
            raise SlurmError(f"{conf}: no such file (SLURM_CONF, or the config's slurm_conf)")
        return run_command(argv, self.env, TIMEOUT_S)

    def release(self) -> Release:
        if self._release is None:
            self._release = Release.parse(self._run("scontrol", "--version"))
        return self._release

    def _json(self, release: Release, *argv: str) -> dict[str, Any]:
        data = json_object(self._run(*argv), f"`{' '.join(argv)}` of Slurm {release}")
        errors = [e for e in data.get("errors") or [] if isinstance(e, dict)]
        if errors:
            what = errors[0].get("description") or errors[0].get("error") or errors[0]
            raise SlurmError(f"`{' '.join(argv)}` of Slurm {release}: {what}")
        return data

    def _read(self, release: Release, cmd: tuple[str, ...]) -> dict[str, Any]:
        try:
            return self._json(release, *cmd)
        except SlurmError:
            self._release = None  # upgraded in place? read the release again next time
            raise

    def nodes(self) -> list[SlurmNode]:
        release = self.release()
        cmd = (
            ("scontrol", "show", "nodes", "--json")
            if release.scontrol_json
            else ("sinfo", "--json")
        )
        return read_nodes(self._read(release, cmd), release, cmd)

    def jobs(self) -> list[Job]:
        release = self.release()
        # Ended jobs too (while slurmctld remembers them): an alert may arrive after Slurm
        # already ended the job it concerns.
        cmd = (
            ("scontrol", "show", "jobs", "--json")
            if release.scontrol_json
            else ("squeue", "--json", "--states=all")
        )
        return read_jobs(self._read(release, cmd), release, cmd)

    def switches(self) -> dict[str, tuple[str, ...]]:
        """The leaf switches, read again once TOPOLOGY_S old: the topology changes only when
        its file is edited and Slurm reconfigured, and the loop reads the cluster every few
        seconds."""
        now = time.monotonic()
        if self._switches is None or now - self._switches[0] >= TOPOLOGY_S:
            self._switches = (now, parse_topology(self._run("scontrol", "show", "topology")))
        return self._switches[1]

    def snapshot(self) -> SlurmSnapshot:
        nodes, jobs = self.nodes(), self.jobs()
        return SlurmSnapshot(self.release(), nodes, jobs, self.switches())

    def view(self) -> ClusterView:
        return self.snapshot().view()

    def admin_level(self, user: str) -> str:
        """The user's AdminLevel in Slurm's accounting (`Administrator`, `Operator`, `None`),
        read without changing anything; SlurmError when accounting cannot be read."""
        out = self._run("sacctmgr", "-nP", "show", "user", user, "format=adminlevel")
        return out.strip().splitlines()[0] if out.strip() else "None"

    def settings(self) -> dict[str, str]:
        """slurmctld's running configuration (`scontrol show config`), key to value."""
        found = {}
        for line in self._run("scontrol", "show", "config").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                found[key.strip()] = value.strip()
        return found


def run_command(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> str:
    """A Slurm client command's stdout; SlurmError naming the command and what it said."""
    try:
        out = subprocess.run(
            list(argv),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        # What it said before it was stopped is often why it hung (a controller it cannot
        # reach, a config it cannot read).
        said = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        tail = f"; it said: {said.strip()[-300:]}" if said and said.strip() else ""
        raise SlurmError(f"{' '.join(argv)}: no answer within {timeout:g} s{tail}") from e
    except OSError as e:
        raise SlurmError(f"{argv[0]}: {e}") from e
    if out.returncode != 0:
        raise SlurmError(f"{' '.join(argv)}: {out.stderr.strip()[:300]}")
    return out.stdout


def json_object(text: str, what: str) -> dict[str, Any]:
    """A command's JSON output, which must be an object; SlurmError naming `what` if not."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SlurmError(f"{what}: not JSON ({e})") from e
    if not isinstance(data, dict):
        raise SlurmError(f"{what}: not a JSON object")
    return data


# ---- reading by shape ------------------------------------------------------------------------


def number(raw: Any) -> int | None:
    """An integer field: a plain number (22.05) or `{"set", "infinite", "number"}` (23.02+)."""
    if isinstance(raw, Mapping):
        if not raw.get("set", True) or raw.get("infinite", False):
            return None
        raw = raw.get("number")
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, int | float):
        return int(raw)
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw)
    raise ValueError(f"not a number: {raw!r}")


def flag(raw: Any) -> bool:
    """A yes/no field: a JSON boolean (23.02+), or a number (22.05)."""
    return raw if isinstance(raw, bool) else bool(number(raw))


def exit_code(raw: Any) -> int | None:
    """A job's exit code: 22.05 prints the raw wait status (the code in its high byte, a signal
    in its low bits), 23.02 and later `{"status", "return_code", "signal"}` with the return
    code unset when a signal ended the job. None for a job a signal ended."""
    if isinstance(raw, Mapping):
        return number(raw.get("return_code"))
    status = number(raw)
    if status is None or status & 0x7F:
        return None
    return status >> 8


def timestamp(raw: Any) -> datetime | None:
    value = number(raw)
    return datetime.fromtimestamp(value, UTC) if value else None


def names(raw: Any) -> list[str]:
    """A list of names: a JSON list, or one string (a comma-separated list in older output)."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [s for s in raw.split(",") if s]
    if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        return list(raw)
    raise ValueError(f"not a list of names: {raw!r}")


def node_state(raw_state: Any, raw_flags: Any = None) -> tuple[str, frozenset[str]]:
    """(base, flags) from `"idle"` + `state_flags` (22.05) or `["IDLE", "DRAIN"]` (23.02+)."""
    parts = [s.upper() for s in names(raw_state)] + [s.upper() for s in names(raw_flags)]
    base = next((s for s in parts if s in NODE_BASE_STATES), "UNKNOWN")
    return base, frozenset(s for s in parts if s != base)


def job_state(raw: Any) -> tuple[str, str]:
    """(state, base): the state as Slurm spells it in squeue (`%T`: the first flag by Slurm's
    order, else the base state), and the base state when a flag named it (empty otherwise).
    22.05 prints the one word (the base is lost); 23.02+ a list of base state and flags."""
    parts = [s.upper() for s in names(raw)]
    if len(parts) == 1:
        return parts[0], ""
    base = next((s for s in parts if s in JOB_BASE_STATES), "")
    for flag in JOB_FLAG_ORDER:
        if flag in parts:
            return flag, base
    if not base:
        raise ValueError(f"no job state in {raw!r}")
    return base, ""


def _text(raw: Any) -> str:
    if raw is None:
        return ""
    if isinstance(raw, str | int | float):
        return str(raw)
    raise ValueError(f"not text: {raw!r}")


def _records(
    data: Mapping[str, Any], key: str, release: Release, cmd: tuple[str, ...]
) -> list[Mapping[str, Any]]:
    rows = data.get(key)
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
        keys = ", ".join(sorted(data)) or "nothing"
        raise SlurmError(
            f"`{' '.join(cmd)}` of Slurm {release}: no {key!r} list (it has {keys}); "
            "slurmedic cannot read this release's output"
        )
    return rows


# One `gpu` entry of a node's gres: `gpu:8`, `gpu:h200:8`, `gpu:h200:8(S:0-1)`; several
# (of different types) are comma-separated, and a socket list may hold commas too.
GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


def gpu_count(gres: str) -> int:
    """The GPUs a node's gres string names (0 without any)."""
    return sum(int(m.group(1)) for m in GPU_GRES.finditer(gres))


def read_nodes(data: Mapping[str, Any], release: Release, cmd: tuple[str, ...]) -> list[SlurmNode]:
    out = []
    for n in _records(data, "nodes", release, cmd):
        try:
            base, flags = node_state(n.get("state"), n.get("state_flags"))
            out.append(
                SlurmNode(
                    name=_text(n.get("name")),
                    base=base,
                    flags=flags,
                    partitions=tuple(names(n.get("partitions"))),
                    reason=_text(n.get("reason")),
                    reason_set_at=timestamp(n.get("reason_changed_at")),
                    gres=_text(n.get("gres")),
                    gres_used=_text(n.get("gres_used")),
                    host=pod_host(_text(n.get("comment"))),
                )
            )
        except ValueError as e:
            raise SlurmError(
                f"`{' '.join(cmd)}` of Slurm {release}: node {n.get('name')!r}: {e}"
            ) from e
    return out


def read_jobs(data: Mapping[str, Any], release: Release, cmd: tuple[str, ...]) -> list[Job]:
    out = []
    for j in _records(data, "jobs", release, cmd):
        try:
            job_id = number(j.get("job_id"))
            if job_id is None:
                raise ValueError("no job_id")
            state, base = job_state(j.get("job_state"))
            # end_time of a running job is its time limit; only an ended job's is when it ended.
            over = state in ENDED_STATES or base in ENDED_STATES
            held = state in HELD_STATES  # its last run's code is kept while Slurm holds it
            ended = timestamp(j.get("end_time")) if over else None
            out.append(
                Job(
                    id=job_id,
                    name=_text(j.get("name")),
                    user=_text(j.get("user_name")),
                    account=_text(j.get("account")),
                    partition=_text(j.get("partition")),
                    state=state,
                    nodes=expand(_text(j.get("nodes"))),
                    excluded=frozenset(expand(_text(j.get("excluded_nodes")))),
                    restarts=number(j.get("restart_cnt")) or 0,
                    requeue=flag(j.get("requeue", True)),
                    comment=_text(j.get("comment")),
                    started=timestamp(j.get("start_time")),
                    ended=ended,
                    base=base,
                    exit_code=exit_code(j.get("exit_code")) if over or held else None,
                )
            )
        except ValueError as e:
            raise SlurmError(
                f"`{' '.join(cmd)}` of Slurm {release}: job {j.get('job_id')!r}: {e}"
            ) from e
    return out


def expand(expr: str) -> tuple[str, ...]:
    if not expr or expr in ("(null)", "None assigned"):
        return ()
    try:
        return tuple(hostlist.expand_hostlist(expr))
    except hostlist.BadHostlist as e:  # read as a field Slurm printed that cannot be read
        raise ValueError(f"not a host list: {expr[:100]!r}") from e


def parse_topology(text: str) -> dict[str, tuple[str, ...]]:
    """Leaf switches of `scontrol show topology`, on every release: those with nodes and no
    switches below them (24.11 and later list an upper switch's nodes too)."""
    switches = {}
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        leaf = not fields.get("Switches") and fields.get("Level", "0") == "0"
        if "SwitchName" in fields and fields.get("Nodes") and leaf:
            switches[fields["SwitchName"]] = expand(fields["Nodes"])
    return switches


def build_view(snap: SlurmSnapshot) -> ClusterView:
    switch_of = {n: s for s, members in snap.switches.items() for n in members}
    view = ClusterView(switches=dict(snap.switches))
    for n in snap.nodes:
        if not NODE_NAME.match(n.name):
            continue
        parts = n.partitions or ("",)
        view.nodes[n.name] = Node(
            n.name,
            parts[0],
            n.state,
            n.reason,
            switch_of.get(n.name),
            other_partitions=tuple(parts[1:]),
            status=n.state_long,
            gpus=n.gpus,
            rebooting=bool(n.flags & REBOOTING),
            host=n.host,
        )
    for j in snap.jobs:
        view.set_job(j)
    return view
