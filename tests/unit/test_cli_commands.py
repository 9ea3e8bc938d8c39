"""The CLI's commands, each loaded from its home only when it runs: what `serve` and its loop
hold in memory is theirs, not every command's."""

from __future__ import annotations

import json
import subprocess
import sys

import click

from webhook.cli import COMMANDS, main

# Runs `slurmedic CMD --help` in a fresh interpreter, then imports what that command's
# processes import once they run (the loop and its parts; the web app and its blueprints, the
# console's aside), and says which modules were loaded.
RUN = """
import importlib, json, sys
from webhook.cli import main
try:
    main(sys.argv[1:] + ["--help"], standalone_mode=False)
    for running in (
        "webhook.service.loop", "webhook.service.leadership", "webhook.service.verify",
        "webhook.service.notify", "webhook.executor.dispatch", "webhook.adapters.slurm",
        "webhook.app", "webhook.app.alerts", "webhook.app.health", "webhook.app.metrics",
    ):
        importlib.import_module(running)
finally:
    print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""
# What other commands need, and neither `serve` nor its loop does.
NOT_THEIRS = (
    "webhook.cli.backtest",
    "webhook.cli.simulate",
    "webhook.cli.console",
    "webhook.cli.trial",
    "webhook.simulate",
    "webhook.backtest",
    "lab",
)


def test_every_command_is_found_under_its_own_name() -> None:
    ctx = click.Context(main)
    assert main.list_commands(ctx) == sorted(COMMANDS)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name, name
    assert main.get_command(ctx, "no-such-command") is None


def test_serve_and_its_loop_load_no_other_commands_modules() -> None:
    for command in ("serve", "loop"):
        out = subprocess.run(
            [sys.executable, "-c", RUN, command], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        loaded = json.loads(out.stderr.strip().splitlines()[-1])
        assert "webhook.cli.serve" in loaded
        assert not [m for m in loaded if m.split(".")[0] in NOT_THEIRS or m in NOT_THEIRS], command
