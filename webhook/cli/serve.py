"""`slurmedic serve`: the webhook under gunicorn, and the live loop beside it."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click
import yaml
from gunicorn.app.base import BaseApplication

from webhook.cli.common import config_option, policy_option
from webhook.core.policy import Policy, PolicyError, load_policy
from webhook.service.config import ConfigError, ServiceConfig, load_config


def read_policy(path: Path | None) -> Policy:
    if path is None:
        return Policy()
    try:
        return load_policy(yaml.safe_load(path.read_text()))
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from e
    except (PolicyError, yaml.YAMLError) as e:
        raise click.ClickException(f"{path}: {e}") from e


def _worker_exit(_server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, config: ServiceConfig) -> None:
        self.service = config
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
        self.cfg.set("child_exit", _worker_exit)

    def load(self) -> Any:
        from webhook.app import create_app

        return create_app(self.service)


def run_loop(config: ServiceConfig, policy: Policy) -> None:
    from webhook.adapters.slurm import SlurmCluster
    from webhook.ledger.store import Ledger
    from webhook.service.loop import LiveLoop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    cluster = SlurmCluster(env=config.cluster.slurm_env())
    ledger = Ledger(config.database_url)
    dispatcher = None
    if config.executor.enabled:
        from webhook.executor.dispatch import Dispatcher
        from webhook.executor.runner import INVENTORY

        env = config.cluster.slurm_env()
        dispatcher = Dispatcher(
            ledger,
            slurm_env=env,
            inventory=config.executor.inventory or INVENTORY,
            timeout=config.executor.timeout_seconds,
            concurrency=config.executor.concurrency,
            retries=config.executor.retries,
            force_monitor=lambda: bool((ledger.setting("switch") or {}).get("monitor")),
            artifacts=config.executor.artifacts_dir.resolve()
            if config.executor.diagnostics
            else None,
        )
    verifier = None
    if config.verification.prometheus_url:
        from webhook.adapters.prometheus import Prometheus
        from webhook.service.verify import Verifier

        verifier = Verifier(ledger, Prometheus(config.verification.prometheus_url), policy)
    loop = LiveLoop(
        ledger,
        policy,
        cluster.view,
        refresh_seconds=config.cluster.refresh_seconds,
        dispatcher=dispatcher,
        verifier=verifier,
        verify_seconds=config.verification.interval_seconds,
    )
    loop.run(stop, config.tick_seconds)


@click.command()
@config_option
@policy_option
def serve(config_path: Path | None, policy_path: Path | None) -> None:
    """Run the webhook (gunicorn) and the live loop that decides."""
    try:
        config = load_config(config_path)
        config.auth.secrets()  # fail now, with the key named, not in a worker
    except ConfigError as e:
        raise click.ClickException(str(e)) from e
    read_policy(policy_path or config.policy_file)  # a bad policy fails here, named, not later
    from webhook.ledger.store import Ledger

    Ledger(config.database_url)  # create the tables once, before workers race to
    # The loop is its own process (not a fork of this one: gunicorn forks its workers from
    # here, and they must not inherit it).
    argv = [sys.executable, "-m", "webhook.cli", "loop"]
    if config_path is not None:
        argv.append(f"--config={config_path}")
    if policy_path is not None:
        argv.append(f"--policy={policy_path}")
    loop = subprocess.Popen(argv)
    # /metrics adds up the request counts of every worker from files here (prometheus-client's
    # multiprocess mode); a fresh directory per run, as its documentation asks.
    metrics_dir = tempfile.mkdtemp(prefix="slurmedic-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        _Gunicorn(config).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        loop.terminate()
        try:
            loop.wait(10)
        except subprocess.TimeoutExpired:
            loop.kill()


@click.command(name="loop")
@config_option
@policy_option
def loop_cmd(config_path: Path | None, policy_path: Path | None) -> None:
    """Run the live loop alone (`serve` runs it beside the webhook)."""
    try:
        config = load_config(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from e
    run_loop(config, read_policy(policy_path or config.policy_file))
