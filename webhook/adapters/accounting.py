"""Slurm accounting (slurmdbd) as history: every attempt of every job (`sacct --json
--duplicates`) and the nodes' DOWN and DRAIN events (`sacctmgr show event`), on every release
from 22.05 to 26.05.

What the releases print differs in shape, not in substance: 22.05's `sacct --json` gives
`state.current` as a string and times as integers, 24.11 and later a list of names and
`{"set", "infinite", "number"}` objects; the fields are read by shape, as the cluster view's
adapter reads them (webhook.adapters.slurm). `sacctmgr show event` has no JSON on the older
releases; its parsable output (`-P`) is the same on all.

Times: the commands print local time for events; they run with TZ=UTC so every time is UTC.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from webhook.adapters.slurm import (
    SlurmError,
    expand,
    job_state,
    json_object,
    number,
    run_command,
    timestamp,
)
from webhook.backtest.history import UNKNOWN, Attempt, NodeEvent, number_attempts

TIMEOUT_S = 300.0  # a month of a large cluster's accounting takes a while
EVENT_FIELDS = ("NodeName", "TimeStart", "TimeEnd", "State", "User", "Reason")


class AccountingError(RuntimeError):
    """Accounting could not be read; the message names the command and why."""


class Accounting:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = {**os.environ, **(env or {}), "TZ": "UTC"}

    def _run(self, *argv: str) -> str:
        try:
            return run_command(argv, self.env, TIMEOUT_S)
        except SlurmError as e:
            raise AccountingError(str(e)) from e

    def sacct(self, start: datetime, end: datetime) -> dict[str, Any]:
        """Every job record (one per attempt) that was eligible, ran or ended in the span."""
        argv = (
            "sacct",
            "--json",
            "--duplicates",
            "--allusers",
            "--allocations",
            f"--starttime={_local(start)}",
            f"--endtime={_local(end)}",
        )
        text = self._run(*argv)
        try:
            return json_object(text, " ".join(argv))
        except SlurmError as e:
            raise AccountingError(str(e)) from e

    def events(self, start: datetime, end: datetime) -> str:
        return self._run(
            "sacctmgr",
            "--parsable2",
            "--noheader",
            "show",
            "event",
            "event=node",
            f"start={_local(start)}",
            f"end={_local(end)}",
            f"format={','.join(EVENT_FIELDS)}",
        )

    def attempts(self, start: datetime, end: datetime) -> list[Attempt]:
        return read_attempts(self.sacct(start, end))

    def node_events(self, start: datetime, end: datetime) -> list[NodeEvent]:
        return read_events(self.events(start, end))


def _local(at: datetime) -> str:
    """sacct's and sacctmgr's time syntax, in the commands' zone (UTC, see the module)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


# ---- reading ----------------------------------------------------------------------------------


def read_attempts(data: Mapping[str, Any]) -> list[Attempt]:
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        keys = ", ".join(sorted(data)) or "nothing"
        raise AccountingError(f"sacct --json: no 'jobs' list (it has {keys})")
    out = []
    for i, raw in enumerate(jobs):
        try:
            out.append(_attempt(raw))
        except (KeyError, TypeError, ValueError) as e:
            raise AccountingError(f"sacct --json: jobs.{i}: {e}") from e
    return number_attempts(out)


def _attempt(raw: Mapping[str, Any]) -> Attempt:
    state_raw = raw.get("state")
    current = state_raw.get("current") if isinstance(state_raw, Mapping) else state_raw
    state, base = job_state(current)
    # A run that was requeued: 22.05 says REQUEUED, 24.11+ [PENDING, REQUEUED] (the record's
    # state is the job's as that run ended; its base state is the next run's wait).
    if state != "REQUEUED":
        state = base or state
    restarts = number(raw.get("restart_cnt"))  # 24.11+; 22.05 has none
    raw_times = raw.get("time")
    times: Mapping[str, Any] = raw_times if isinstance(raw_times, Mapping) else {}
    nodes = raw.get("nodes") or ""
    if nodes in ("None assigned", "(null)"):
        nodes = ""
    return Attempt(
        job=int(number(raw["job_id"]) or 0),
        attempt=UNKNOWN if restarts is None else restarts,
        name=str(raw.get("name") or ""),
        user=str(raw.get("user") or ""),
        partition=str(raw.get("partition") or ""),
        nodes=expand(str(nodes)) if nodes else (),
        submitted=timestamp(times.get("submission")),
        started=timestamp(times.get("start")),
        ended=timestamp(times.get("end")),
        state=state,
        exit_code=_exit_code(raw.get("exit_code")),
        gpus=_gpus(raw.get("tres")),
    )


def _exit_code(raw: Any) -> int | None:
    if isinstance(raw, Mapping):
        return number(raw.get("return_code"))
    return number(raw)


def _gpus(raw: Any) -> int:
    """Allocated GPUs: the `gres/gpu` TRES (0 when accounting does not track it)."""
    allocated = raw.get("allocated") if isinstance(raw, Mapping) else None
    for t in allocated if isinstance(allocated, list) else []:
        if isinstance(t, Mapping) and t.get("type") == "gres" and t.get("name") == "gpu":
            return int(number(t.get("count")) or 0)
    return 0


def read_events(text: str, fields: tuple[str, ...] = EVENT_FIELDS) -> list[NodeEvent]:
    """Node events from `sacctmgr --parsable2 --noheader show event format=<fields>`; a
    reason holding the separator keeps it (the other fields cannot hold one)."""
    col = {name.lower(): i for i, name in enumerate(fields)}
    missing = {"nodename", "timestart", "timeend", "state", "reason", "user"} - set(col)
    if missing:
        raise AccountingError(f"sacctmgr show event: no {', '.join(sorted(missing))} field")
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < len(fields):
            raise AccountingError(f"sacctmgr show event: line {n}: {line[:120]!r}")
        extra = len(parts) - len(fields)
        if extra:
            r = col["reason"]
            parts[r : r + extra + 1] = ["|".join(parts[r : r + extra + 1])]
        node = parts[col["nodename"]]
        if not node:
            continue  # a cluster event
        began = _time(parts[col["timestart"]])
        if began is None:
            raise AccountingError(f"sacctmgr show event: line {n}: no start time in {line!r}")
        # `ops(1001)`: the name, and the uid Slurm recorded (the number alone if unnamed).
        user = re.sub(r"\(\d+\)$", "", parts[col["user"]].strip())
        out.append(
            NodeEvent(
                node,
                began,
                _time(parts[col["timeend"]]),
                parts[col["state"]],
                parts[col["reason"]].strip(),
                user,
            )
        )
    out.sort(key=lambda e: (e.start, e.node))
    return out


def _time(text: str) -> datetime | None:
    """sacctmgr's `2026-12-02T19:40:00` (UTC here), or Unknown/None for an open end."""
    text = text.strip()
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        return None
