"""The `slurmedic` command."""

from __future__ import annotations

import click

from webhook import __version__


class _Main(click.Group):
    """Imports `lab` (the development lab, which production never runs) only when it is asked
    for: `serve`, `replay` and the rest load none of it."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "lab"])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "lab":
            from lab.cli import lab

            return lab
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurmedic")
def main() -> None:
    """slurmedic keeps distributed GPU training on Slurm running."""


def _register() -> None:
    from webhook.cli.backtest import backtest
    from webhook.cli.cluster import cluster
    from webhook.cli.console import console
    from webhook.cli.decisions import decisions
    from webhook.cli.policy import policy
    from webhook.cli.replay import replay
    from webhook.cli.review import approve, reject, review, verdict
    from webhook.cli.rules import rules
    from webhook.cli.serve import loop_cmd, serve
    from webhook.cli.simulate import simulate
    from webhook.cli.switches import breaker, resume, switch
    from webhook.cli.trial import trial_group

    main.add_command(rules)
    main.add_command(cluster)
    main.add_command(replay)
    main.add_command(policy)
    main.add_command(decisions)
    main.add_command(serve)
    main.add_command(loop_cmd)
    main.add_command(review)
    main.add_command(approve)
    main.add_command(reject)
    main.add_command(verdict)
    main.add_command(switch)
    main.add_command(breaker)
    main.add_command(resume)
    main.add_command(console)
    main.add_command(trial_group)
    main.add_command(backtest)
    main.add_command(simulate)


_register()
