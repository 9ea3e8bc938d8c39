"""The `slurmedic` command."""

from __future__ import annotations

import click

from webhook import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurmedic")
def main() -> None:
    """slurmedic keeps distributed GPU training on Slurm running."""


def _register() -> None:
    from lab.cli import lab
    from webhook.cli.cluster import cluster
    from webhook.cli.decisions import decisions
    from webhook.cli.policy import policy
    from webhook.cli.replay import replay
    from webhook.cli.review import approve, reject, review
    from webhook.cli.rules import rules
    from webhook.cli.serve import loop_cmd, serve
    from webhook.cli.switches import breaker, resume, switch

    main.add_command(lab)
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
    main.add_command(switch)
    main.add_command(breaker)
    main.add_command(resume)


_register()
