"""The loop's keeper: one process, forked from `serve` before gunicorn and before any thread, that
forks each loop `serve` asks for.

A loop started as a process of its own imports everything again (SQLAlchemy, pydantic and its
models, the core, the executor): some 54 MB of its own before it reads an alert, and a second
or more of CPU at each restart. `serve` has imported all of it already for its web workers; a
loop forked from it shares those pages (copy on write) and keeps some 17 MB of its own at rest.
It cannot be forked from `serve` itself: by then `serve` runs threads (the loop's supervisor,
gunicorn's), and a fork copies only the thread that calls it, with whatever locks the others
held. The keeper is forked before any of them and stays single-threaded.

How the two talk (a Unix socket pair; a line each way, the loop's word pipe passed with the
request as SCM_RIGHTS):
- `serve` -> keeper: `start` and the write end of the word pipe; the keeper forks a loop.
- keeper -> `serve`: `started PID`, later `ended PID CODE` (CODE as Popen's: -N for signal N).
- `serve` gone (the socket's end): the keeper stops its loop (SIGTERM, as `serve`'s own stop)
  and waits for it, then ends. The keeper gone: the loop sees its parent change and stops
  (serve's `_stop_when_orphaned`), and `serve` starts its loops as processes of their own.

Each is named in /proc/PID/comm (what `ps -e`, `top` and `pgrep` show): `slurmedic-keep` and
`slurmedic-loop`. Their command line stays `serve`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from webhook.cli.common import LOG_FORMAT

KEEPER_NAME = "slurmedic-keep"
LOOP_NAME = "slurmedic-loop"
STOPS = {signal.SIGTERM, signal.SIGINT}  # what a stop of serve sends its process group

# What a loop runs, in the child: (its word pipe's write end, its parent's pid) -> exit code.
RunLoop = Callable[[int, int], int]


def name_this_process(name: str) -> None:
    """This process's name where ps and pgrep read it (15 characters at most)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(name)


class KeeperGone(Exception):
    """No keeper to fork from: it ended (killed), or could not be forked."""


class Keeper:
    """`serve`'s end: start a loop, learn how it ended."""

    def __init__(self, run_loop: RunLoop, *, orphan_grace: float = 60.0) -> None:
        """Fork the keeper now. `orphan_grace`: how long a loop whose keeper has gone may take
        to stop by itself (finishing its playbooks) before it is killed. KeeperGone if this
        process already runs threads (a fork would copy only this one, and the locks the
        others hold) or cannot fork."""
        if threading.active_count() > 1:
            names = ", ".join(t.name for t in threading.enumerate())
            raise KeeperGone(f"serve already runs threads ({names}): no fork")
        self.orphan_grace = orphan_grace
        # What every loop and every web worker would otherwise make private the first time the
        # collector walks it (its headers written): kept out of the collector's reach.
        gc.freeze()
        _flush()  # nothing buffered here is written again by each fork
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            pid = os.fork()
        except OSError as e:  # out of processes (pids.max), of file descriptors
            raise KeeperGone(f"no keeper forked: {e}") from e
        if pid == 0:  # the keeper
            ours.close()
            _keep(theirs, run_loop)
        theirs.close()
        self.pid, self.sock = pid, ours
        self._buffer = b""

    def start(self, word_fd: int) -> ForkedLoop:
        """A new loop, its word pipe's write end `word_fd` (still open here: the caller's)."""
        try:
            socket.send_fds(self.sock, [b"start\n"], [word_fd])
        except (OSError, ValueError) as e:  # gone, or closed here (serve's stop)
            raise KeeperGone(str(e)) from e
        words = self._line(None)
        if not words or words[0] != "started":  # "refused": a loop of its still runs
            raise KeeperGone(f"the keeper answered {' '.join(words or [])!r} to a start")
        return ForkedLoop(self, int(words[1]))

    def _line(self, timeout: float | None) -> list[str] | None:
        """The keeper's next line, split; None if none came within `timeout`; KeeperGone at
        the socket's end, or once it is closed here."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if not select.select([self.sock], [], [], left)[0]:
                    return None
                chunk = self.sock.recv(256)
            except (OSError, ValueError) as e:  # reset; closed here (a fd of -1)
                raise KeeperGone(str(e)) from e
            if not chunk:
                raise KeeperGone("the keeper's socket closed")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode().split()

    def close(self) -> None:
        """This process's end of the socket closed (a worker forked from serve holds a copy)."""
        self.sock.close()

    def end(self, timeout: float = 5.0) -> None:
        """serve's last word: the keeper ends (stopping a loop still running) and is reaped, its
        CPU time and its loops' counted in serve's as a child's."""
        self.close()
        deadline = time.monotonic() + timeout
        with contextlib.suppress(ChildProcessError):  # reaped already (gunicorn's master)
            while not os.waitpid(self.pid, os.WNOHANG)[0]:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)


class ForkedLoop:
    """A loop the keeper forked, as much of Popen as the supervisor uses: `wait` and `poll`
    (from two threads at once: the supervisor's, and serve's stop), `terminate`, `kill`. It is
    not serve's child: it is signalled through a pidfd taken while it runs, never a pid that
    may be another process's by then."""

    def __init__(self, keeper: Keeper, pid: int) -> None:
        self.keeper, self.pid = keeper, pid
        self.returncode: int | None = None
        self._reading = threading.Lock()  # one reader of the keeper's socket at a time
        self._pidfd: int | None = None
        with contextlib.suppress(OSError):  # ended already; or a kernel before 5.3
            self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        return self._wait(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(LOOP_NAME, timeout or 0.0)
        return code

    def _wait(self, timeout: float | None) -> int | None:
        """The loop's exit code as the keeper reaped it; None if it still runs at `timeout`.
        The keeper gone: the loop, orphaned, stops by itself (its parent changed); it is waited
        for (killed after the keeper's `orphan_grace`) and its code, which went with the keeper,
        reads -SIGKILL."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            # In slices, so that the other thread's wait gets its turn.
            slice_s = 0.2 if left is None else min(0.2, max(0.0, left))
            if self._reading.acquire(timeout=slice_s):
                try:
                    if self.returncode is None:
                        words = self.keeper._line(slice_s)
                        if words is not None and words[:2] == ["ended", str(self.pid)]:
                            self._ended(int(words[2]))
                except KeeperGone:
                    self._ended(self._orphan_ended())
                finally:
                    self._reading.release()
            if self.returncode is None and left is not None and left <= 0:
                return None
        return self.returncode

    def _ended(self, code: int) -> None:
        self.returncode = code
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _orphan_ended(self) -> int:
        deadline = time.monotonic() + self.keeper.orphan_grace
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._running():
            self.kill()
        return -signal.SIGKILL

    def _running(self) -> bool:
        """Alive and not a zombie (an orphan's status may never be read: init's to reap)."""
        if self._pidfd is not None:  # readable once the process has ended
            return not select.select([self._pidfd], [], [], 0)[0]
        return running(self.pid)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)


def running(pid: int) -> bool:
    """`pid` alive and not a zombie (/proc's state: an orphan's status may never be read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the parenthesised command name, which may hold spaces.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def carry_on_after_hangup() -> None:
    """A hangup (SIGHUP to serve's process group: the terminal it ran in closed) is not a stop:
    gunicorn's master takes it as its reload, and the keeper and serve's loop carry on. A
    handler, not SIG_IGN: what the loop executes (ansible-runner's runs, whose end pexpect
    starts with a SIGHUP) gets the default back at its exec, as a handler is not inherited."""
    signal.signal(signal.SIGHUP, lambda _sig, _frame: None)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _keep(sock: socket.socket, run_loop: RunLoop) -> NoReturn:
    """The keeper's life: fork a loop when asked, say how it ended; end with `serve`."""
    code = 0
    try:
        name_this_process(KEEPER_NAME)
        serve, me = os.getppid(), os.getpid()
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        # serve's stop (its process group's SIGTERM, a terminal's SIGINT) reaches the loop
        # itself; the keeper stays to say how the loop ended, and ends when serve has. Blocked,
        # not ignored: a loop inherits the mask, and one sent to it before it has its handlers
        # waits for them (ignored, it would be lost).
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        carry_on_after_hangup()
        loop: int | None = None

        def say(line: str) -> bool:
            """False once serve cannot hear it (gone, or its end closed at its stop)."""
            try:
                sock.sendall(line.encode())
            except OSError:
                return False
            return True

        while True:
            # A loop's end is polled: a SIGCHLD handler would race this select.
            ready = select.select([sock], [], [], 0.2 if loop is not None else None)[0]
            if loop is not None:
                done, status = os.waitpid(loop, os.WNOHANG)
                if done:
                    ended = os.waitstatus_to_exitcode(status)
                    loop = None
                    if not say(f"ended {done} {ended}\n"):
                        break
            if not ready:
                continue
            try:
                msg, fds, _, _ = socket.recv_fds(sock, 64, 1)
            except OSError:
                msg, fds = b"", []
            if not msg:  # serve is gone
                break
            if loop is not None or not fds:  # one loop at a time, each with its word pipe
                for fd in fds:
                    os.close(fd)
                if not say("refused\n"):
                    break
                continue
            _flush()
            loop = os.fork()
            if loop == 0:
                sock.close()
                _be_the_loop(fds[0], me, run_loop)
            os.close(fds[0])
            if not say(f"started {loop}\n"):
                break
        if loop is not None:  # serve gone: its loop stops, as at serve's own stop
            logging.getLogger("slurmedic.keeper").warning(
                "serve (pid %d) is gone: the loop stops", serve
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(loop, signal.SIGTERM)
            os.waitpid(loop, 0)
    except BaseException:  # the keeper says why it ends, then ends
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _be_the_loop(word_fd: int, keeper: int, run_loop: RunLoop) -> NoReturn:
    code = 1
    try:
        name_this_process(LOOP_NAME)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # as a new process: a stop ends it
        # What it inherited stays frozen (shared); what it makes is collected as anywhere.
        code = run_loop(word_fd, keeper)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # as Python: the message said, exit 1
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:  # a SIGINT before the loop's handler: ended by it, as Python is
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # as an uncaught exception ends a process: exit 1
        traceback.print_exc()
    finally:
        _exit_as_python_does(code)


def _exit_as_python_does(code: int) -> NoReturn:
    """End as an interpreter ends, then leave without serve's unwinding: its threads that are
    not daemons are waited for (a playbook the executor still runs records its result, as a
    term's abandoned dispatcher promises), then atexit's functions run."""
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()  # what Python runs at its end: its atexit hooks for threads, the joins
        else:
            for t in threading.enumerate():
                if t is not threading.current_thread() and not t.daemon:
                    t.join()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    finally:
        _flush()
        os._exit(code)
