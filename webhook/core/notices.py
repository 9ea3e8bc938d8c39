"""What slurmedic tells people, as alerts of its own (posted to the site's Alertmanager).

Six kinds, each open while it needs a human (or someone should know) and resolved once handled:

    SlurmedicAwaitingApproval  a recommendation waits for approval (with its age): open until
                               approved, rejected or superseded
    SlurmedicEscalation        slurmedic hands an incident to a human: open until someone
                               records a verdict on it (`slurmedic verdict`, the console)
    SlurmedicRecoveryFailed    a requeued job's successor failed too (an escalation of guard
                               recovery_failed): open until a verdict, as an escalation
    SlurmedicActionMismatch    Slurm showed otherwise after a run than its decision set out
                               (a double requeue, a drain whose reason is not its own:
                               webhook/core/outcome.py): open until a verdict
    SlurmedicJobStopped        slurmedic stopped a job (a stop carried out; a dry run in
                               monitor mode stopped nothing and tells nobody): for the job's
                               owner, open until a verdict on the stop or STOP_OPEN after it ran
    SlurmedicNodeReplace       a node slurmedic drained goes to a person for replacement or
                               service, not to another repair (an escalation of guard
                               replace_node: webhook/core/repairs.py): open until a verdict

Each names the job's owner when it is known (`slurm_user`, `slurm_account`, `slurm_partition`),
so a site routes the failures of a job's own making to the people who own it and the rest to
its operators (alert_rules/alertmanager.yml). The owner is what slurmedic recorded of the job
once (a note on the decision, so a notice keeps its labels after Slurm forgets the job), else
what the cluster view shows, else the partition the decision recorded. Those values come from
Slurm and may reach a receiver's template (an e-mail address, a chat channel): only plain names
(OWNER_VALUE) become labels; another is left off, and never as an empty value.

Pure: the notices are computed from plain rows, the cluster view's jobs and the time; the
notifier (webhook/service/notify.py) posts them and resolves those that are gone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from webhook.core.cluster import Job
from webhook.core.lifecycle import AWAITING_APPROVAL, EXECUTED

Kind = Literal[
    "awaiting_approval", "escalation", "recovery_failed", "mismatch", "job_stopped", "node_replace"
]
ALERTNAME: dict[Kind, str] = {
    "awaiting_approval": "SlurmedicAwaitingApproval",
    "escalation": "SlurmedicEscalation",
    "recovery_failed": "SlurmedicRecoveryFailed",
    "mismatch": "SlurmedicActionMismatch",
    "job_stopped": "SlurmedicJobStopped",
    "node_replace": "SlurmedicNodeReplace",
}
SEVERITY: dict[Kind, str] = {
    "awaiting_approval": "warning",
    "escalation": "critical",
    "recovery_failed": "critical",
    "mismatch": "critical",
    "job_stopped": "warning",
    "node_replace": "warning",
}
# The escalations that say which kind they are by their guard.
BY_GUARD: dict[str, Kind] = {"recovery_failed": "recovery_failed", "replace_node": "node_replace"}
# The label Alertmanager routes slurmedic's notices by (alert_rules/alertmanager.yml).
SOURCE = ("notice", "slurmedic")
# How long a stop's notice stays open without a verdict: long enough for its owner to read it
# on a working day, short enough that a job stopped last week does not keep paging anyone
# (Alertmanager repeats a firing notice; the console keeps the stop for good).
STOP_OPEN = timedelta(hours=24)
# A Slurm user, account or partition as a label value: a plain name (Linux user names, Slurm's
# account and partition names; `user@domain` where SSSD qualifies them). Nothing else reaches a
# receiver's template.
OWNER_VALUE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@-]{0,63}\Z")
OWNER_LABELS = {"user": "slurm_user", "account": "slurm_account", "partition": "slurm_partition"}


@dataclass(frozen=True)
class Owner:
    """Who owns a job, as Slurm names them; empty: not known."""

    user: str = ""
    account: str = ""
    partition: str = ""

    @classmethod
    def of(cls, job: Job) -> Owner:
        return cls(user=job.user, account=job.account, partition=job.partition)

    @classmethod
    def from_json(cls, value: Any) -> Owner | None:
        """An owner as a note recorded it (as_json); None when it is not one."""
        if not isinstance(value, Mapping):
            return None
        return cls(**{k: v for k in OWNER_LABELS if isinstance(v := value.get(k), str)})

    def as_json(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in OWNER_LABELS if getattr(self, k)}

    def labels(self) -> dict[str, str]:
        """Its label values that are plain names; the rest left off (problems says which)."""
        return {
            label: value
            for k, label in OWNER_LABELS.items()
            if OWNER_VALUE.match(value := getattr(self, k))
        }

    def problems(self) -> list[str]:
        """One line for each value left off the labels: the field and why."""
        return [
            f"{label} {value[:80]!r} is not a plain name ({OWNER_VALUE.pattern}): left off"
            for k, label in OWNER_LABELS.items()
            if (value := getattr(self, k)) and not OWNER_VALUE.match(value)
        ]


@dataclass(frozen=True)
class Open:
    """A decision that needs a human, as the ledger holds it."""

    decision_id: int
    incident: str
    job: int | None
    action: str
    cause: str
    guard: str | None
    state: str
    reason: str
    # When it was decided; for a stop carried out, when it ran (what STOP_OPEN counts from).
    at: datetime
    mismatch: str | None = None  # what Slurm showed otherwise after the decision's run
    partition: str | None = None  # the partition the decision recorded (its job's)
    owner: Owner | None = None  # the job's owner as a note on the decision recorded it


@dataclass(frozen=True)
class Notice:
    kind: Kind
    decision_id: int
    incident: str
    job: int | None
    action: str
    cause: str
    reason: str
    since: datetime
    owner: Owner = field(default_factory=Owner)

    @property
    def key(self) -> tuple[str, int]:
        return (self.kind, self.decision_id)


def owner(row: Open, jobs: Mapping[int, Job]) -> Owner:
    """The owner of a decision's job: as recorded, else as the cluster view shows the job, else
    the partition the decision recorded. A decision without a job has none."""
    if row.job is None:
        return Owner()
    if row.owner is not None:
        return row.owner
    if (job := jobs.get(row.job)) is not None:
        return Owner.of(job)
    return Owner(partition=row.partition or "")


def learnt(rows: Iterable[Open], jobs: Mapping[int, Job]) -> dict[int, Owner]:
    """The owners to record, by decision id: of the jobs the view knows, on decisions that
    have none recorded yet (recorded once, a notice keeps its labels after Slurm forgets the
    job)."""
    return {
        r.decision_id: Owner.of(jobs[r.job])
        for r in rows
        if r.owner is None and r.job is not None and r.job in jobs
    }


def _kinds(r: Open, now: datetime) -> list[tuple[Kind, str]]:
    if r.state == AWAITING_APPROVAL:
        return [("awaiting_approval", r.reason)]
    out: list[tuple[Kind, str]] = []
    if r.mismatch:
        out.append(("mismatch", r.mismatch))
    elif r.action == "escalate":
        out.append((BY_GUARD.get(r.guard or "", "escalation"), r.reason))
    # A stop tells its owner even when Slurm showed otherwise after it (the operators are told
    # that apart); a dry run stopped nothing.
    if r.action == "stop" and r.state == EXECUTED and now - r.at < STOP_OPEN:
        out.append(("job_stopped", r.reason))
    return out


def notices(
    rows: Iterable[Open], now: datetime, jobs: Mapping[int, Job] | None = None
) -> list[Notice]:
    """The notices of the decisions that need a human (the ledger picks them: awaiting approval,
    an escalation or a mismatch without a verdict, a stop carried out without one), each with
    its job's owner (`jobs`: the cluster view's)."""
    jobs = jobs or {}
    return [
        Notice(kind, r.decision_id, r.incident, r.job, r.action, r.cause, why, r.at, owner(r, jobs))
        for r in rows
        for kind, why in _kinds(r, now)
    ]


def age(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def labels(n: Notice) -> dict[str, str]:
    """What a notice is to Alertmanager (its identity) and what a site routes it by."""
    return {
        "alertname": ALERTNAME[n.kind],
        "severity": SEVERITY[n.kind],
        SOURCE[0]: SOURCE[1],
        "incident": n.incident,
        "action": n.action,
        "cause": n.cause,
        "decision": str(n.decision_id),
        **({"slurm_job_id": str(n.job)} if n.job is not None else {}),
        **n.owner.labels(),
    }


def as_alert(
    n: Notice, now: datetime, ends: timedelta, console: str, generator: str = ""
) -> dict[str, Any]:
    """Alertmanager's API v2 alert for a notice: firing until now + `ends` (re-posted before
    then while it is open), or resolved now when `ends` is zero."""
    waited = age((now - n.since).total_seconds())
    link = f"{console.rstrip('/')}/console/incident/{n.incident}" if console else ""
    what = {
        "awaiting_approval": f"{n.action} of incident {n.incident} waits for approval ({waited})",
        "escalation": f"incident {n.incident} needs a human ({n.cause})",
        "recovery_failed": f"the recovery of incident {n.incident} failed",
        "mismatch": f"the {n.action} of incident {n.incident} left Slurm otherwise than decided",
        "job_stopped": f"slurmedic stopped job {n.job} (incident {n.incident}, {n.cause})",
        "node_replace": f"{n.incident}: replace or service the node ({n.cause}): no repair "
        "of slurmedic's mends it",
    }[n.kind]
    return {
        "labels": labels(n),
        "annotations": {
            "summary": what,
            "description": n.reason,
            "waiting_since": n.since.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "age": waited,
            **({"console": link} if link else {}),
        },
        "startsAt": n.since.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "endsAt": (now + ends).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generatorURL": link or generator,
    }
