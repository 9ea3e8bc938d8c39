"""`slurmedic serve`: the webhook under gunicorn, and the live loop beside it."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import click
from gunicorn.app.base import BaseApplication

# What the loop runs, imported here at the top: `serve` holds it before it forks the keeper,
# and every loop the keeper forks shares it (webhook/cli/keeper.py).
from webhook.adapters.prometheus import Prometheus
from webhook.cli.common import LOG_FORMAT, config_of, config_option, policy_of, policy_option
from webhook.cli.keeper import ForkedLoop, Keeper, KeeperGone, RunLoop, carry_on_after_hangup
from webhook.core.policy import Policy
from webhook.core.validation import is_number
from webhook.executor import cgroup
from webhook.executor.cgroup import RUN_CGROUP_ENV, RunGroup
from webhook.executor.dispatch import Dispatcher
from webhook.executor.fence import Fence
from webhook.executor.runner import INVENTORY
from webhook.ledger.settings import CorruptSetting
from webhook.ledger.store import Ledger, LoopRefused, Unavailable
from webhook.service.config import REPLICA_ENV, ConfigError, ServiceConfig
from webhook.service.leadership import Replica
from webhook.service.loop import LiveLoop, monitor_forced
from webhook.service.notify import Notifier
from webhook.service.verify import Verifier


def _worker_exit(_server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def _closing_oversized(limit: int) -> Callable[[Any, Any], None]:
    """A request whose body is over the limit gets its 413 with `Connection: close`: its
    body is never read, so on a kept-alive connection the client's next request would be read
    from the middle of it (and dropped). Chunked bodies have no length up front: they close
    too."""

    def pre_request(_worker: Any, req: Any) -> None:
        length = next((v for k, v in req.headers if k == "CONTENT-LENGTH"), None)
        chunked = any(k == "TRANSFER-ENCODING" for k, _ in req.headers)
        if chunked or (length is not None and is_number(length) and int(length) > limit):
            req.must_close = True

    return pre_request


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, config: ServiceConfig, app: Any, keeper: Keeper | None) -> None:
        self.service, self.app, self.keeper = config, app, keeper
        super().__init__()

    def load_config(self) -> None:
        self.cfg.set("bind", self.service.listen)
        self.cfg.set("workers", self.service.workers)
        self.cfg.set("worker_class", "gthread")
        self.cfg.set("threads", 4)
        self.cfg.set("accesslog", None)
        self.cfg.set("graceful_timeout", 5)
        # gunicorn >= 24 opens a control socket in ~/.gunicorn, shared by every instance of
        # the user; slurmedic needs none (and two instances would fight over it).
        if "control_socket_disable" in self.cfg.settings:
            self.cfg.set("control_socket_disable", True)
        # The app is loaded once, in the master, and the workers share its pages (the imports
        # are most of a worker's memory). It serves nothing: it holds no ledger connection
        # for a worker to inherit (`serve` released them), and each worker opens its own.
        self.cfg.set("preload_app", True)
        self.cfg.set("child_exit", _worker_exit)
        # A worker is a fork of serve: it would hold serve's end of the keeper's socket, and the
        # keeper would not see serve's end while the worker lives.
        if self.keeper is not None:
            self.cfg.set("post_fork", lambda _server, _worker: self.keeper.close())
        self.cfg.set("pre_request", _closing_oversized(self.service.max_body_bytes))
        # Header fields up to 64 KiB reach the application, which refuses those over 8,190
        # bytes with a JSON reason (HEADER_FIELD_LIMIT) instead of gunicorn's HTML page.
        self.cfg.set("limit_request_field_size", 65536)

    def load(self) -> Any:
        # What gunicorn made since serve froze the app: out of the collector's reach too,
        # before the workers are forked from here.
        gc.freeze()
        return self.app


METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's, for its multiprocess mode
PARENT_ENV = "SLURMEDIC_SERVE_PID"  # set for the loop `serve` starts: whose loop it is
# The pipe a loop `serve` started says on how it ends, before its exit (its fd number): the
# exit code alone may be gunicorn's to read (LoopSupervisor).
WORD_FD_ENV = "SLURMEDIC_LOOP_WORD_FD"
STOPPED = b"stopped"  # told to stop, and stopped cleanly
REFUSED_WORD = b"refused"
REFUSED = 3  # the loop's exit code when it may not run (a second loop on a SQLite file)
# How a loop that was told to stop ends when its word could not be said: by the signal itself.
STOP_SIGNALS = frozenset({-signal.SIGTERM, -signal.SIGINT})


class LoopSupervisor:
    """`serve`'s loop, kept running: one that fails (an error, a `kill -9`, the OOM killer)
    starts again after 1 s, then 2, 4, ... up to a minute while it keeps failing within a
    minute of its start. /readyz says not-ready meanwhile (the loop's beat stops). A loop that
    was told to stop (it says so on a pipe before its exit 0, or it was ended by SIGTERM or
    SIGINT) is not started again, nor one refused its ledger (it says so, and exits REFUSED):
    serve stops, saying why.

    The exit code alone does not tell how it ended: gunicorn's master, this process, reaps
    every child that ends (`waitpid(-1)`), and when it takes the loop's status first, Popen
    reads 0. A 0 without the loop's word is a loop that ended some other way."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        grace: float = 10.0,
        keeper: Keeper | None = None,
    ) -> None:
        # How long a stopped loop may take to finish the playbooks it runs before it is killed.
        self.argv, self.env, self.grace = argv, env, grace
        # Each loop forked by the keeper (webhook/cli/keeper.py); without one, or once it has
        # gone, a process of its own (`argv`, `env`).
        self.keeper = keeper
        self.stopping = threading.Event()
        # A stop waits for a launch under way, and sees the loop it launched: none starts after.
        self._launching = threading.Lock()
        self.proc: subprocess.Popen[bytes] | ForkedLoop | None = None
        self.thread = threading.Thread(target=self._run, name="loop-supervisor", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        log = logging.getLogger("slurmedic.serve")
        delay = 1.0
        while not self.stopping.is_set():
            started = time.monotonic()
            said, write = os.pipe()
            try:
                with self._launching:
                    if self.stopping.is_set():
                        os.close(said)
                        return
                    self.proc = self._launch(write)
            finally:
                os.close(write)
            code = self.proc.wait()
            word = _read_all(said)
            if self.stopping.is_set():
                return
            if word == REFUSED_WORD or code == REFUSED:
                log.error("the loop was refused its ledger: serve stops")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            if word == STOPPED or code in STOP_SIGNALS:
                # Told to stop (SIGTERM, SIGINT: often the one its whole process group got,
                # serve's own stop on its way, while gunicorn still stops its workers): not
                # started again. A signal that came before the loop's handler was in place,
                # or during its exit, ends it as that signal: that is a stop too, not a crash
                # (a loop started again there decides beside the next serve). /readyz says
                # not ready.
                log.warning("the loop stopped as it was told: not started again")
                return
            if time.monotonic() - started > 60:
                delay = 1.0
            how = f"exit {code}" if code != 0 else "its exit status reaped by another"
            log.error("the loop ended (%s): starting it again in %.0f s", how, delay)
            if self.stopping.wait(delay):
                return
            delay = min(delay * 2, 60.0)

    def _launch(self, word_fd: int) -> subprocess.Popen[bytes] | ForkedLoop:
        if (keeper := self.keeper) is not None:
            try:
                return keeper.start(word_fd)
            except KeeperGone as e:
                logging.getLogger("slurmedic.serve").error(
                    "the loop's keeper is gone (%s): each loop is started as a process of its "
                    "own from now on",
                    e,
                )
                keeper.close()
                self.keeper = None
        return subprocess.Popen(
            self.argv, env={**self.env, WORD_FD_ENV: str(word_fd)}, pass_fds=(word_fd,)
        )

    def stop(self) -> None:
        self.stopping.set()
        with self._launching:
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        if (keeper := self.keeper) is not None:
            keeper.end()


def _read_all(fd: int) -> bytes:
    """What was written to a pipe whose writers are gone (what a writer still holding it
    has not written yet is not waited for), and the pipe closed."""
    os.set_blocking(fd, False)
    out = b""
    try:
        while chunk := os.read(fd, 64):
            out += chunk
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return out


def _word_to_serve() -> int | None:
    """The pipe to the serve that started this loop (None: run alone), kept from the runs."""
    fd = os.environ.pop(WORD_FD_ENV, "")
    if not is_number(fd):
        return None
    os.set_inheritable(int(fd), False)
    return int(fd)


def _say(fd: int | None, word: bytes) -> None:
    """The loop's word to its serve on how it ends (serve may be gone)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, word)
            os.close(fd)


def _stop_when_orphaned(parent: int, halt: Callable[[], None]) -> None:
    """The loop `serve` started ends with its serve, however that ended (a `kill -9` of serve
    leaves no loop deciding beside the next serve's)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            logging.getLogger(__name__).warning(
                "the loop's parent (pid %d: serve, or its keeper) is gone: the loop stops", parent
            )
            halt()
            return


def run_loop(config: ServiceConfig, policy: Policy, word_fd: int | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    ledger = Ledger(config.database_url)
    ledger.lock_for_loop()  # SQLite: one loop a file (LoopRefused otherwise)
    cluster = config.cluster.reader()
    policy, changed = config.cluster.fit(policy)
    if changed:
        logging.getLogger("slurmedic.loop").warning("%s", changed)
    # serve's group (prepared before it started anything), or, run alone, its own
    group = (
        _run_group(config)
        if (given := os.environ.pop(RUN_CGROUP_ENV, None)) is None
        else (RunGroup.from_env(given))
    )
    if given is not None:  # serve's, which said what it is when it made it: said again here
        logging.getLogger("slurmedic.loop").info(
            "the loop's playbook runs: %s",
            f"in serve's group {group.procs.parent} (weight {group.weight})"
            if group is not None
            else "unweighted, as serve's",
        )

    fence = Fence()  # until when this replica's runs may act on Slurm

    def make_loop(ledger: Ledger) -> LiveLoop:
        """A new term's loop, built from the ledger as a restart builds one; `ledger` is
        fenced by the term (every part of the loop writes through it)."""
        dispatcher = None
        if config.executor.enabled:
            dispatcher = Dispatcher(
                ledger,
                slurm_env=config.cluster.playbook_env(),
                inventory=config.executor.inventory or INVENTORY,
                timeout=config.executor.timeout_seconds,
                concurrency=config.executor.concurrency,
                retries=config.executor.retries,
                force_monitor=lambda: monitor_forced(ledger),
                artifacts=config.executor.artifacts_dir.resolve()
                if config.executor.diagnostics
                else None,
                group=group,
                fence=fence.path,
                repairs=policy.repairs,
            )
        verifier = None
        if config.verification.prometheus_url:
            verifier = Verifier(ledger, Prometheus(config.verification.prometheus_url), policy)
        notifier = None
        if config.notify.alertmanager_url:
            notifier = Notifier(
                ledger,
                config.notify.alertmanager_url,
                console_url=config.console.public_url,
                interval=config.notify.interval_seconds,
                lookback=timedelta(hours=config.notify.escalation_lookback_hours),
            )
        return LiveLoop(
            ledger,
            policy,
            cluster.view,
            refresh_seconds=config.cluster.refresh_seconds,
            dispatcher=dispatcher,
            verifier=verifier,
            verify_seconds=config.verification.interval_seconds,
            notifier=notifier,
        )

    replica = Replica(
        ledger,
        config.replica_name(),
        make_loop,
        lease_seconds=config.replicas.lease_seconds,
        fence=fence,
    )

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        replica.halt()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    orphaned = threading.Event()

    def orphan() -> None:
        if not replica.halted.is_set():  # told to stop first: that is how it ends
            orphaned.set()
        replica.halt()

    if parent := os.environ.pop(PARENT_ENV, ""):  # serve's loop
        carry_on_after_hangup()
        threading.Thread(
            target=_stop_when_orphaned, args=(int(parent), orphan), daemon=True
        ).start()
    try:
        replica.run(config.tick_seconds)
    finally:
        fence.close()
    # Orphaned is not told to stop: its keeper gone while serve lives, serve starts another.
    if not orphaned.is_set():
        _say(word_fd, STOPPED)


def _run_group(config: ServiceConfig) -> RunGroup | None:
    """The playbook runs' cgroup (executor.cpu_weight), or None, said once either way."""
    if not config.executor.enabled or config.executor.cpu_weight is None:
        return None
    try:
        group = cgroup.prepare(config.executor.cpu_weight)
    except cgroup.Unavailable as e:
        click.echo(f"playbook runs not weighted (executor.cpu_weight): {e}", err=True)
        return None
    click.echo(f"playbook runs: CPU weight {group.weight}, in {group.procs.parent}", err=True)
    return group


@click.command()
@config_option
@policy_option
def serve(config_path: Path | None, policy_path: Path | None) -> None:
    """Run the webhook (gunicorn) and the live loop that decides."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # the workers inherit it
    config = config_of(config_path)
    try:
        config.auth.secrets()  # fail now, with the key named, not in gunicorn's master
        if config.console.enabled:
            config.console.secret_key()
    except ConfigError as e:
        raise click.ClickException(str(e)) from e
    policy_of(policy_path or config.policy_file)  # a bad policy fails here, named, not later

    try:
        ledger = Ledger(config.database_url)  # the tables made once, before workers race to it
        ledger.lock_for_loop()  # a second serve on one SQLite file: refused here, by name
        ledger.unlock_loop()
    except (Unavailable, LoopRefused) as e:  # a mistyped path, an unreachable PostgreSQL
        raise click.ClickException(str(e)) from e
    # Nothing of it for the keeper, a loop or a web worker to inherit: one connection used by
    # two processes corrupts its state.
    ledger.release()
    # The replica's name, for its loop and its web workers alike.
    os.environ[REPLICA_ENV] = config.replica_name()
    # Before anything is started: on cgroup v2, serve moves itself to a leaf, alone.
    group = _run_group(config)
    os.environ[RUN_CGROUP_ENV] = group.env() if group is not None else ""
    args = [f"--config={config_path}"] if config_path is not None else []
    if policy_path is not None:
        args.append(f"--policy={policy_path}")
    # /metrics adds up the request counts of every worker from files here (prometheus-client's
    # multiprocess mode, which it picks when it is imported: before the imports below); a fresh
    # directory per run, as its documentation asks.
    metrics_dir = tempfile.mkdtemp(prefix="slurmedic-metrics-")
    os.environ[METRICS_DIR_ENV] = metrics_dir
    serve_pid = os.getpid()
    loop: LoopSupervisor | None = None
    grace = config.executor.timeout_seconds + 10  # a stop does not cut a playbook short
    try:
        # Each loop is forked by the keeper, forked here before any thread, from a serve that
        # has imported what a loop runs: its pages are shared with this process and its web
        # workers. gunicorn forks its workers from here too, and they must not inherit a loop.
        app = _the_app(config, ledger)
        keeper: Keeper | None
        try:
            # A loop orphaned by its keeper's end may finish its playbooks, as at a stop.
            keeper = Keeper(_forked_loop(args), orphan_grace=grace)
        except KeeperGone as e:
            click.echo(f"each loop a process of its own: {e}", err=True)
            keeper = None
        loop = LoopSupervisor(
            # Without a keeper (killed), a loop is started as a process of its own.
            [sys.executable, "-m", "webhook.cli", "loop", *args],
            {
                **{k: v for k, v in os.environ.items() if k != METRICS_DIR_ENV},
                PARENT_ENV: str(os.getpid()),
            },
            grace=grace,
            keeper=keeper,
        )
        loop.start()
        _Gunicorn(config, app, keeper).run()
    finally:
        # A worker that ends (stopped, or started again after a timeout) leaves through here
        # too, as a fork of this process: the metrics and the loop are serve's to end.
        if os.getpid() == serve_pid:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            if loop is not None:
                loop.stop()


def _the_app(config: ServiceConfig, ledger: Ledger) -> Any:
    """The web app, made before the keeper's fork: what serve makes after it is the keeper's
    to keep a copy of, a page at a time, as serve writes to it (the loop's own imports are
    this module's). gunicorn's master serves it to its workers (preload_app)."""
    from webhook.app import create_app

    return create_app(config, ledger)  # it opens no connection: the ledger stays released


def _forked_loop(args: list[str]) -> RunLoop:
    """What a loop the keeper forks runs: `slurmedic loop` with serve's arguments and its
    environment, as a loop started as a process of its own would, its word pipe `word_fd`, its
    parent the keeper."""

    def run(word_fd: int, parent: int) -> int:
        os.environ.pop(METRICS_DIR_ENV, None)  # the web workers' metrics, not the loop's
        os.environ[WORD_FD_ENV] = str(word_fd)
        os.environ[PARENT_ENV] = str(parent)
        loop_cmd.main(args=args, prog_name="slurmedic loop", standalone_mode=True)
        return 0

    return run


@click.command(name="loop")
@config_option
@policy_option
def loop_cmd(config_path: Path | None, policy_path: Path | None) -> None:
    """Run the live loop alone (`serve` runs it beside the webhook)."""
    config = config_of(config_path)

    word_fd = _word_to_serve()
    try:
        run_loop(config, policy_of(policy_path or config.policy_file), word_fd)
    except CorruptSetting as e:  # the breaker, read at start: mend it, then start again
        raise click.ClickException(str(e)) from e
    except LoopRefused as e:
        click.echo(f"Error: {e}", err=True)
        _say(word_fd, REFUSED_WORD)
        sys.exit(REFUSED)
