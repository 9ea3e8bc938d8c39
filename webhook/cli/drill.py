"""`slurmedic drill JOB` and `slurmedic drills`: recovery drills, asked for and followed.

The command asks; the leader's loop plans the drill on its view of the cluster (the job must be
running, in the policy's partitions, not opted out), and carries it out in the mode the policy
gives requeues: a dry run in monitor mode, an approval in approve mode (webhook/core/drills.py).
"""

from __future__ import annotations

import getpass
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from webhook.adapters.prometheus import Prometheus, PrometheusError
from webhook.cli.common import config_of, config_option, duration, ledger_of
from webhook.core import drills
from webhook.core.patterns import NODE_NAME
from webhook.ledger.drills import Drill

# How far back the job's checkpoints are read to learn its interval.
CHECKPOINTS_WINDOW = timedelta(hours=24)


@click.command()
@config_option
@click.argument("job", type=click.IntRange(1))
@click.option(
    "--exclude", metavar="NODE", help="Also exclude this node of the job, as for a hardware fault."
)
@click.option(
    "--before-checkpoint",
    is_flag=True,
    help="Interrupt it right before its next checkpoint is due (the most work lost: the worst "
    "case), from the interval of its reported checkpoints; default: now.",
)
@click.option(
    "--margin",
    default="30s",
    show_default=True,
    callback=duration,
    help="With --before-checkpoint: this long before the checkpoint is due.",
)
@click.option("--by", help="Who asks (default: your user name).")
@click.option(
    "--wait",
    "wait_s",
    type=click.IntRange(0),
    default=0,
    help="Wait up to this many seconds for the drill's result, and exit 1 unless it passed.",
)
def drill(
    config_path: Path | None,
    job: int,
    exclude: str | None,
    before_checkpoint: bool,
    margin: timedelta,
    by: str | None,
    wait_s: int,
) -> None:
    """Test JOB's recovery on purpose: requeue its running attempt as a real recovery would,
    then verify that it resumes from its last checkpoint with usable output. Drills are kept
    apart from every figure of real recoveries."""
    if exclude is not None and not NODE_NAME.match(exclude):
        raise click.BadParameter(f"{exclude[:80]!r} is not a node name", param_hint="--exclude")
    config = config_of(config_path)
    ledger = ledger_of(config_path)
    now = datetime.now(UTC)
    when = now
    if before_checkpoint:
        url = config.verification.prometheus_url
        if not url:
            raise click.ClickException(
                "--before-checkpoint: verification.prometheus_url is not set (the job's "
                "checkpoints are read from Prometheus)"
            )
        try:
            times = Prometheus(url, timeout=10).checkpoint_times(job, CHECKPOINTS_WINDOW)
            when = drills.before_checkpoint(times, margin, now)
        except (PrometheusError, drills.Refused) as e:
            raise click.ClickException(f"--before-checkpoint: job {job}: {e}") from e
    asked = ledger.drills.ask(job, by or getpass.getuser(), now, when, exclude)
    at = "now" if when <= now else f"at {when:%H:%M:%S} UTC"
    click.echo(f"drill {asked} of job {job} asked for {at}: the leader's loop plans it")
    if wait_s:
        _wait(ledger.drills.latest, asked, time.monotonic() + wait_s)


def _wait(listing: Any, asked: int, until: float) -> None:
    last = ""
    while time.monotonic() < until:
        found = next((d for d in listing(500) if d.id == asked), None)
        if found is not None:
            said = _outcome(found)
            if said != last:
                click.echo(f"drill {asked}: {said}")
                last = said
            final = found.outcome in NOT_RUN_SAID and found.outcome != "awaiting_approval"
            if (
                final
                or found.state == "refused"
                or (found.recovery is not None and found.recovery.state != "watching")
            ):
                if _passed(found):
                    return
                raise SystemExit(1)
        time.sleep(2)
    raise click.ClickException(f"drill {asked}: no result within the wait")


# A drill whose requeue does not run, in words; all but an approval awaited are final.
NOT_RUN_SAID = {
    "dry_run": "a dry run only (monitor mode): its requeue was recorded, not run",
    "awaiting_approval": "its requeue awaits approval (`slurmedic review`)",
    "rejected": "its requeue was rejected",
    "expired": "its requeue expired unapproved",
    "run_failed": "its requeue failed to run (`slurmedic decisions show`)",
    "superseded": "its requeue was superseded",
}


def _passed(d: Drill) -> bool:
    return d.recovery is not None and d.recovery.state == "recovered"


def _outcome(d: Drill) -> str:
    if d.state == "asked":
        return "asked, not planned yet"
    if d.state == "refused":
        return f"refused: {d.reason}"
    if d.recovery is None:
        return NOT_RUN_SAID.get(
            d.outcome, f"decided ({d.incident}): waiting for its requeue to run"
        )
    r = d.recovery
    if r.state == "watching":
        return "requeued: watching the job come back"
    verdict = "passed" if r.state == "recovered" else r.state
    return f"{verdict}: {r.reason}"


def _as_json(d: Drill) -> dict[str, Any]:
    r = d.recovery
    return {
        "id": d.id,
        "job": d.job,
        "by": d.by,
        "asked_at": d.asked_at.isoformat(),
        "not_before": d.not_before.isoformat(),
        "exclude": d.exclude,
        "state": d.state,
        "incident": d.incident,
        "outcome": d.outcome,
        "reason": d.reason if r is None else r.reason,
        "resumed_from_step": None if r is None else r.resume_step,
        "last_checkpoint_step": None if r is None else r.checkpoint_step,
        "lost_steps": None if r is None else r.lost_steps,
        "lost_seconds": None if r is None else r.lost_seconds,
        "start_seconds": None if r is None else r.start_seconds,
        "quality_before": None if r is None else r.quality_before,
        "quality_after": None if r is None else r.quality_after,
    }


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per drill, newest first.")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
def drills_cmd(config_path: Path | None, as_json: bool, limit: int) -> None:
    """The latest recovery drills and what became of each."""
    found = ledger_of(config_path).drills.latest(limit)
    if as_json:
        click.echo(json.dumps([_as_json(d) for d in found], indent=1))
        return
    if not found:
        click.echo("no drills yet (slurmedic drill JOB)")
    for d in found:
        click.echo(
            f"{d.id:>4}  job {d.job:<8} {d.asked_at:%Y-%m-%d %H:%M}  by {d.by}: {_outcome(d)}"
        )
