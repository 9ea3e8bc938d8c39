"""The `slurmedic` command."""

from __future__ import annotations

import importlib

import click

from webhook import __version__

# Each command's home, imported only when that command runs (or `--help` lists it): `serve`
# and its loop load none of the backtest, the simulator, the trial report or the console's
# user commands (every process of `serve` holds what it imported), and `lab` (the development
# lab, which production never runs) is not loaded by any other command.
COMMANDS = {
    "approve": "webhook.cli.review:approve",
    "backtest": "webhook.cli.backtest:backtest",
    "breaker": "webhook.cli.switches:breaker",
    "cluster": "webhook.cli.cluster:cluster",
    "console": "webhook.cli.console:console",
    "decisions": "webhook.cli.decisions:decisions",
    "doctor": "webhook.cli.doctor:doctor",
    "drill": "webhook.cli.drill:drill",
    "drills": "webhook.cli.drill:drills_cmd",
    "files": "webhook.cli.files:files",
    "lab": "lab.cli:lab",
    "loop": "webhook.cli.serve:loop_cmd",
    "nodes": "webhook.cli.nodes:nodes",
    "policy": "webhook.cli.policy:policy",
    "reject": "webhook.cli.review:reject",
    "repairs": "webhook.cli.repairs:repairs",
    "replay": "webhook.cli.replay:replay",
    "resume": "webhook.cli.switches:resume",
    "review": "webhook.cli.review:review",
    "rules": "webhook.cli.rules:rules",
    "serve": "webhook.cli.serve:serve",
    "simulate": "webhook.cli.simulate:simulate",
    "switch": "webhook.cli.switches:switch",
    "trial": "webhook.cli.trial:trial_group",
    "verdict": "webhook.cli.review:verdict",
}


class _Main(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, name = COMMANDS[cmd_name].split(":")
        command: click.Command = getattr(importlib.import_module(module), name)
        return command


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurmedic")
def main() -> None:
    """slurmedic keeps distributed GPU training on Slurm running."""
