"""Job-side training progress, pushed to a Prometheus Pushgateway.

Two lines in a training script::

    progress = ProgressReporter.from_env()     # at start: announces this attempt
    progress.resumed(step, written_at=t)       # the checkpoint it loaded (step 0: none)
    progress.step(step, step_seconds, quality=loss)  # after every optimizer step
    progress.checkpoint(step)                  # after a checkpoint is safely written

`step_seconds` is this rank's own compute time for the step (forward, backward, optimizer),
without the time spent waiting in collectives for other ranks: in synchronous training every
rank's wall-clock step time is the same, and only the compute time shows which one is slow.
`quality` (optional) is a value that says whether training is sound, the loss or any metric
the job names: after a restart, slurmedic checks that it continues where the failed attempt
left it rather than jumping back to where training began (a corrupt checkpoint). `resumed`
says which checkpoint the attempt loaded: slurmedic checks it is the job's last complete one.

Environment: `SLURMEDIC_PUSHGATEWAY` (URL; unset disables reporting), `SLURMEDIC_PUSH_INTERVAL`
(seconds between pushes, default 15), and Slurm's own `SLURM_JOB_ID`, `SLURM_PROCID` (the
rank), `SLURMD_NODENAME`, `SLURM_RESTART_COUNT`. The grouping key is the Slurm job id and the
rank, so every rank owns one group and a requeued attempt overwrites its predecessor's.

No call does I/O in the caller's thread: each one updates the gauges and leaves a snapshot of
them for one background thread per reporter, which pushes at most once per `interval` (the
attempt's start at once, a checkpoint without waiting the interval out). Every push replaces
the rank's whole group with every gauge set so far, so only the latest snapshot matters: one
that is superseded before it was sent is dropped and counted. A failed push is counted; the
next snapshot goes out as usual. `close()` (also run at exit) pushes the last snapshot within
a short bound and stops the thread.

Standard library only: training environments install this without slurmedic's service.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import http.client
import math
import os
import socket
import threading
import time
import urllib.parse
import warnings
from dataclasses import dataclass, field
from types import TracebackType

__all__ = ["DEFAULT_INTERVAL", "GAUGES", "PUSH_JOB", "ProgressReporter"]

PUSH_JOB = "training"
# Every gauge a rank pushes (each with one label, `node`), and its help text.
GAUGES = {
    "training_step": "Last completed training step.",
    "training_step_seconds": "This rank's compute time of the last step.",
    "training_last_step_timestamp_seconds": "When the last step completed.",
    "training_last_checkpoint_step": "Step of the last complete checkpoint.",
    "training_last_checkpoint_timestamp_seconds": "When the last checkpoint was written.",
    "training_attempt": "Slurm restart count of this job attempt.",
    "training_attempt_start_timestamp_seconds": "When this attempt started.",
    "training_resume_step": "Step of the checkpoint this attempt resumed from (0: none).",
    "training_quality": "The job's quality value (its loss, or a metric it names).",
}
# The Prometheus text format, version 0.0.4: what the Pushgateway accepts from every client.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Prometheus sees a pushed value only when it next scrapes the Pushgateway (every 15 to 30 s in
# most setups), so pushing more often changes nothing it stores; the rules that read progress
# work in minutes (a hang after 10 minutes, productive within 2). 15 s keeps every scrape
# fresh at the shortest common scrape interval, and a rank's load on the Pushgateway constant.
DEFAULT_INTERVAL = 15.0
# A background push can afford to wait for a loaded Pushgateway; a stuck one only delays the
# next snapshot, never a step.
DEFAULT_TIMEOUT = 5.0
# How long close() (and so the process's exit) waits for the last push before cutting it off.
CLOSE_TIMEOUT = 2.0
# After close() cuts the connection, how long it waits for the pusher to notice.
_ABORT_GRACE = 1.0


@dataclass
class ProgressReporter:
    gateway: str | None
    job_id: str
    rank: int
    node: str
    attempt: int = 0
    timeout: float = DEFAULT_TIMEOUT  # of one push, in the background thread
    failed_pushes: int = 0
    # The gauges set so far; a push sends only these, and replaces the rank's whole group.
    values: dict[str, float] = field(default_factory=dict)
    interval: float = DEFAULT_INTERVAL  # the least time between two pushes, in seconds
    pushes: int = field(default=0, init=False)  # accepted by the Pushgateway
    # Snapshots never sent: superseded by a newer one, or still waiting when close() gave up.
    dropped_snapshots: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.values["training_attempt"] = self.attempt
        # The mailbox between the training thread and the pusher, all guarded by `_cond`.
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = 0  # the process that started the thread
        self._pending: dict[str, float] | None = None  # the snapshot not taken yet
        self._urgent = False  # ... holds a start or a checkpoint
        self._offered = 0  # snapshots handed over so far
        self._done = 0  # ... of which every one up to here was sent, failed or dropped
        self._flush_to = 0  # flush() waits for the snapshots up to here
        self._last_push = -math.inf
        self._last_early = -math.inf  # the last push that did not wait the interval out
        self._closing = False
        self._abandoned = False  # close() gave up on the pusher
        self._conn: http.client.HTTPConnection | None = None  # the push in flight

    @classmethod
    def from_env(cls) -> ProgressReporter:
        """A reporter for this rank, from Slurm's environment; pushes the attempt's start.

        The start replaces what the previous attempt pushed last, so a hang is measured from
        this attempt's start until its first step (while it loads its checkpoint).
        """
        env = os.environ
        reporter = cls(
            gateway=env.get("SLURMEDIC_PUSHGATEWAY") or None,
            job_id=env.get("SLURM_JOB_ID", "0"),
            rank=int(env.get("SLURM_PROCID", "0")),
            node=env.get("SLURMD_NODENAME", os.uname().nodename),
            attempt=int(env.get("SLURM_RESTART_COUNT", "0")),
            interval=_env_seconds("SLURMEDIC_PUSH_INTERVAL", DEFAULT_INTERVAL),
        )
        reporter.start()
        return reporter

    def start(self) -> None:
        with self._cond:
            self.values["training_attempt_start_timestamp_seconds"] = time.time()
            # The start tells the hang rule to stop judging the previous attempt: not throttled.
            self._offer(urgent=True)

    def step(self, step: int, seconds: float, quality: float | None = None) -> None:
        now = time.time()
        # Converted here, so that a value that is not a number fails in the caller, not later
        # in the pusher.
        value = None if quality is None else float(quality)
        with self._cond:
            self.values["training_step"] = float(step)
            self.values["training_step_seconds"] = float(seconds)
            self.values["training_last_step_timestamp_seconds"] = now
            if value is not None:
                self.values["training_quality"] = value
            self._offer(urgent=False)

    def resumed(self, step: int, written_at: float | None = None) -> None:
        """The checkpoint this attempt loaded at its start (step 0 and no time: it starts from
        scratch), reported once before its first step. It is also the attempt's last
        checkpoint until it writes one of its own."""
        with self._cond:
            self.values["training_resume_step"] = float(step)
        if written_at is not None:
            self.checkpoint(step, written_at=written_at)
        else:
            with self._cond:
                self._offer(urgent=True)

    def checkpoint(self, step: int, written_at: float | None = None) -> None:
        """A complete checkpoint at `step`. After a restart, report the one the attempt resumed
        from with `written_at` (when it was written): a checkpoint written before this attempt
        started is not one of its own."""
        at = time.time() if written_at is None else written_at
        with self._cond:
            self.values["training_last_checkpoint_step"] = float(step)
            self.values["training_last_checkpoint_timestamp_seconds"] = float(at)
            # What a requeue would lose is measured from the last checkpoint: do not leave an
            # old one on the Pushgateway for a whole interval.
            self._offer(urgent=True)

    def flush(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Push the latest snapshot now, without waiting for the interval, and wait at most
        `timeout` seconds for it: True once every snapshot so far was sent, failed or dropped.
        """
        with self._cond:
            if self._thread is None:
                return True
            target = self._offered
            self._flush_to = max(self._flush_to, target)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._done >= target or self._abandoned, timeout)
            return self._done >= target

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Push the last snapshot, waiting at most `timeout` seconds (then the push in flight
        is cut off), and stop the pusher. Later calls update `values` but push nothing."""
        atexit.unregister(self.close)
        thread = self._thread
        if thread is not None and self._pid != os.getpid():
            # A forked child: the pusher is its parent's, and the lock may have been copied
            # held. Leave both alone.
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            with self._cond:
                self._abandoned = True
                conn = self._conn
                self._cond.notify_all()
            if conn is not None:
                _abort(conn)
            thread.join(_ABORT_GRACE)
        with self._cond:
            if self._pending is not None:
                self._pending = None
                self.dropped_snapshots += 1

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def exposition(self) -> str:
        """The gauges set so far in the Prometheus text format: the body of a push."""
        with self._cond:
            values = dict(self.values)
        return self._render(values)

    def url(self) -> str:
        """Where this rank's group lives on the Pushgateway."""
        gateway = str(self.gateway)
        if urllib.parse.urlsplit(gateway).scheme not in ("http", "https"):
            gateway = f"http://{gateway}"
        key = [("job", PUSH_JOB), ("slurm_job_id", self.job_id), ("rank", str(self.rank))]
        return gateway.rstrip("/") + "/metrics" + "".join(_path_part(k, v) for k, v in key)

    # ---- the training thread's side (with `_cond` held) ----------------------------------------
    def _offer(self, urgent: bool) -> None:
        """Leave a snapshot of the gauges for the pusher, replacing one it has not taken."""
        if not self.gateway or self._closing:
            return
        if self._thread is None:
            self._pid = os.getpid()
            self._thread = threading.Thread(
                target=self._run, name=f"slurmedic-progress-{self.rank}", daemon=True
            )
            self._thread.start()
            atexit.register(self.close)
        wake = self._pending is None or urgent
        if self._pending is not None:
            self.dropped_snapshots += 1
        self._pending = dict(self.values)
        self._urgent = self._urgent or urgent
        self._offered += 1
        # While a snapshot waits out the interval, the pusher need not wake for a newer one.
        if wake:
            self._cond.notify_all()

    # ---- the pusher thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                values = self._take()
                if values is None:
                    self._cond.notify_all()
                    return
                offered = self._offered
            ok = self._put(values)
            with self._cond:
                if ok:
                    self.pushes += 1
                else:
                    self.failed_pushes += 1
                self._done = offered
                self._cond.notify_all()

    def _take(self) -> dict[str, float] | None:
        """Wait until the pending snapshot may go and take it; None: stop."""
        while not self._abandoned:
            if self._pending is None:
                if self._closing:
                    return None
                self._cond.wait()
                continue
            now = time.monotonic()
            regular = self._last_push + self.interval
            due = regular
            # A start or a checkpoint goes at once, but at most once an interval: a script
            # that checkpoints every step still pushes at most twice an interval.
            if self._urgent:
                due = min(due, self._last_early + self.interval)
            forced = self._closing or self._flush_to > self._done
            if forced:
                due = now
            if due > now:
                self._cond.wait(due - now)
                continue
            if now < regular and not forced:
                self._last_early = now
            self._last_push = now
            values, self._pending, self._urgent = self._pending, None, False
            return values
        return None

    def _put(self, values: dict[str, float]) -> bool:
        """One PUT of the group with these values: True when the Pushgateway took it."""
        url = urllib.parse.urlsplit(self.url())
        cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        conn: http.client.HTTPConnection | None = None
        try:
            body = self._render(values).encode()
            conn = cls(url.hostname or "", url.port, timeout=self.timeout)
            with self._cond:
                if self._abandoned:
                    return False
                self._conn = conn  # for close() to cut off
            # PUT replaces the group: nothing of a previous attempt stays.
            conn.request("PUT", url.path, body, {"Content-Type": CONTENT_TYPE})
            with conn.getresponse() as response:
                response.read()
                return 200 <= response.status < 300
        except Exception:
            # Whatever went wrong (a refused or cut connection, a bad answer, a port or a value
            # that is not a number), the push failed; the pusher lives on for the next one.
            return False
        finally:
            if conn is not None:
                with self._cond:
                    self._conn = None
                conn.close()

    def _render(self, values: dict[str, float]) -> str:
        node = _label_value(self.node)
        lines = []
        for name, help_text in GAUGES.items():
            if name in values:
                lines += [
                    f"# HELP {name} {help_text}",
                    f"# TYPE {name} gauge",
                    f'{name}{{node="{node}"}} {_number(values[name])}',
                ]
        return "\n".join(lines) + "\n"


def _abort(conn: http.client.HTTPConnection) -> None:
    # shutdown() wakes a thread blocked in recv() on the socket; close() alone would not.
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed by the pusher
            sock.shutdown(socket.SHUT_RDWR)


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0:  # also NaN
        # A typo in the job script must not stop training: say so, and use the default.
        warnings.warn(f"{name}={raw!r} is not a number of seconds; using {default}", stacklevel=3)
        return default
    return value


def _path_part(name: str, value: str) -> str:
    # The Pushgateway's grouping-key syntax: base64 for values a URL path cannot carry.
    if value == "" or "/" in value:
        return f"/{name}@base64/{base64.urlsafe_b64encode(value.encode()).decode() or '='}"
    return f"/{name}/{urllib.parse.quote(value, safe='')}"


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
