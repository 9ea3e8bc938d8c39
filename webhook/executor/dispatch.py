"""Dispatch recorded decisions to playbooks, by mode, and record what happened.

monitor  -> a check-mode run; its commands are recorded as the dry-run output, the state stays
            `recorded` and Slurm is never touched.
approve  -> the same check-mode run as soon as it is decided, kept as a note (the approver reads
            the exact commands; a note never races the human's approval), then nothing until
            a human approves (`slurmedic approve ID`, the console), then as enforce.
enforce  -> running -> executed | failed, with the run's commands and output.

Every act a playbook makes is fenced (webhook/executor/fence.py): a run whose replica's lease
may have ended changes nothing, and is left `running` for the leader. Once a run is done, what
Slurm shows is checked against the decision (webhook/core/outcome.py): a mismatch (a double
requeue, a drain whose reason is not its own) is recorded on the decision and escalated.

Within an incident the drain runs before the requeue (the successor must not land on a node
that is still in service); incidents run concurrently, up to `concurrency` at once. Playbooks
are idempotent, so a decision found `running` after a crash is simply run again: it finds the
work done (a drained node, a job whose restart count moved on) and changes nothing twice.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential

from webhook.core.decisions import JOB_ACTIONS
from webhook.core.incidents import attempt_of, drain_reason
from webhook.core.lifecycle import (
    APPROVED,
    AWAITING_APPROVAL,
    EXECUTABLE,
    EXECUTED,
    FAILED,
    PENDING,
    RECORDED,
    RUNNING,
    WAITING,
    IllegalTransition,
)
from webhook.core.outcome import drain_mismatch, requeue_mismatch
from webhook.core.policy import Repairs
from webhook.executor.cgroup import RunGroup
from webhook.executor.diagnostics import keep
from webhook.executor.runner import INVENTORY, CannotRun, RunResult, run_playbook
from webhook.ledger.leases import LostLease
from webhook.ledger.schema import DecisionRow
from webhook.ledger.store import Ledger

log = logging.getLogger("slurmedic.executor")
ORDER = {"drain": 0, "resume": 0, "requeue": 1, "stop": 1}
# Slurm answers that mean "try again in a moment", not "no"; and an act refused because Slurm
# changed since the plan's read (playbooks/library/slurmedic_act.py): a new run plans afresh.
TRANSIENT = re.compile(
    r"Socket timed out|Unable to contact slurm controller|Zero Bytes were "
    r"transmitted|Resource temporarily unavailable|slurm_load_\w+ error|"
    r"changed since it was read|"
    # slurmrestd out of reach or restarting (the playbooks' commands over REST)
    r"over slurmrestd\): .*(Connection refused|Read timed out|HTTP 50[234])"
)


def playbook_for(
    row: DecisionRow, repairs: Repairs | None = None
) -> tuple[str, dict[str, Any]] | None:
    """The playbook and extra vars that carry out a decision (None: nothing to run); `repairs`:
    the policy's, for a health check's command."""
    attempt = attempt_of(row.incident) if row.job is not None else 0
    if row.action == "reset_gpu":
        return "reset_gpu", {"slurmedic_nodes": row.nodes, "slurmedic_incident": row.incident}
    if row.action == "reboot":
        reason = drain_reason(row.incident, "reboot")
        return "reboot_nodes", {"slurmedic_nodes": row.nodes, "slurmedic_reason": reason}
    if row.action == "health_check":
        repairs = repairs or Repairs()
        return "health_check", {
            "slurmedic_nodes": row.nodes,
            "slurmedic_incident": row.incident,
            # The policy's command: a node's inventory may name its own (slurmedic_health_check).
            "slurmedic_health_check_default": list(repairs.health_check),
            "slurmedic_health_check_timeout": int(repairs.health_check_timeout.total_seconds()),
        }
    if row.action == "drain":
        reason = drain_reason(row.incident, row.cause, row.note or "")
        return "drain_nodes", {"slurmedic_nodes": row.nodes, "slurmedic_reason": reason}
    if row.action == "resume":
        return "resume_nodes", {"slurmedic_nodes": row.nodes}
    if row.action == "requeue" and row.job is not None:
        return "requeue_job", {
            "slurmedic_job": row.job,
            "slurmedic_attempt": attempt,
            "slurmedic_exclude": row.exclude,
            "slurmedic_readmit": row.readmit or [],
        }
    if row.action == "stop" and row.job is not None:
        return "stop_job", {"slurmedic_job": row.job, "slurmedic_attempt": attempt}
    return None


def _mismatch(row: DecisionRow, result: RunResult) -> str | None:
    """What Slurm shows after the run, against what the decision set out to do."""
    if not result.after:
        return None
    if row.action == "requeue" and row.job is not None:
        return requeue_mismatch(row.job, attempt_of(row.incident), result.after)
    if row.action == "drain":
        reason = drain_reason(row.incident, row.cause, row.note or "")
        return drain_mismatch(row.nodes, reason, result.before, result.after)
    return None


class Dispatcher:
    def __init__(
        self,
        ledger: Ledger,
        *,
        slurm_env: dict[str, str] | None = None,
        inventory: Path = INVENTORY,
        timeout: int = 120,
        concurrency: int = 4,
        retries: int = 3,
        force_monitor: Callable[[], bool] = lambda: False,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        artifacts: Path | None = None,
        backoff: float = 1.0,
        group: RunGroup | None = None,
        fence: Path | None = None,
        repairs: Repairs | None = None,
    ) -> None:
        self.repairs = repairs or Repairs()  # the policy's: a health check's command, timeout
        self.fence = fence  # the replica's fence file; None: acts are not fenced
        self.backoff = backoff  # seconds before the first retry; doubling after
        self.group = group  # the runs' cgroup (webhook/executor/cgroup.py); None: the loop's
        self.ledger, self.inventory, self.timeout = ledger, inventory, timeout
        self.artifacts = artifacts  # None: no diagnostics
        self.slurm_env = slurm_env or {}
        self.retries, self.force_monitor, self.clock = retries, force_monitor, clock
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="playbook")
        # Diagnostics have their own workers: a slow node must not hold up other incidents.
        self.diagnostics = ThreadPoolExecutor(max_workers=2, thread_name_prefix="diagnostics")
        self.busy: dict[str, Future[None]] = {}
        self.abandoned = False  # its term ended: the run in hand finishes, no other starts
        self.unfit: str | None = None  # why this host could not run a playbook (CannotRun)

    def dispatch(self, rows: list[DecisionRow]) -> None:
        """Hand decisions to the pool, one task per incident (in order within it)."""
        by_incident: dict[str, list[DecisionRow]] = defaultdict(list)
        for r in rows:
            by_incident[r.incident].append(r)
        for incident, group in by_incident.items():
            if incident in self.busy and not self.busy[incident].done():
                continue  # picked up again on a later step
            group.sort(key=lambda r: (ORDER.get(r.action, 2), r.id))
            self.busy[incident] = self.pool.submit(self._run_incident, group)

    def in_flight(self) -> bool:
        """A run of this dispatcher has started and not finished."""
        return any(not f.done() for f in self.busy.values())

    def pending(self) -> list[DecisionRow]:
        """Work waiting: enforce decisions, approved ones, and runs a crash interrupted."""
        return self.ledger.in_state(*EXECUTABLE)

    def _run_incident(self, rows: list[DecisionRow]) -> None:
        for row in rows:
            if self.abandoned:
                log.warning("incident %s left to the leader: this term has ended", row.incident)
                return
            try:
                ok = self._run_one(row)
            except LostLease as e:
                # Another replica leads now: it carries out the rest of this incident.
                log.warning("incident %s left to the leader: %s", row.incident, e)
                return
            except CannotRun as e:
                # This host cannot run playbooks (its disk full): the claim stays `running`,
                # run again by a leader that can, as after a crash. The replica steps down.
                log.error("decision %s cannot run on this host: %s", row.id, e)
                self.unfit = str(e)
                self.abandoned = True
                with contextlib.suppress(Exception):
                    note = {"by": "executor", "error": f"this host cannot run it: {e}"}
                    self.ledger.add_note(row.id, note, self.clock())
                return
            except Exception:
                log.exception("decision %s failed to run", row.id)
                if row.action == "drain" and not self._failed(row):
                    # The error was this replica's own (its ledger cut off mid-run), not the
                    # drain's: the ledger still holds it pending or running, and whoever leads
                    # runs it again, then the requeue. Failing the requeue now would leave a
                    # job behind a drain that goes on to succeed.
                    return
                ok = False
            monitor = row.mode == "monitor" or self.force_monitor()
            if not ok and row.action == "drain" and not monitor:
                # A requeue must not send the job back to a node still in service (a failed
                # dry run changed nothing: the requeue's own dry run still shows its commands).
                for later in rows[rows.index(row) + 1 :]:
                    self._move(
                        later,
                        FAILED,
                        {"by": "executor", "error": f"drain (decision {row.id}) failed first"},
                    )
                break
        # After the requeue, and on workers of their own: an unreachable node or a hanging
        # nvidia-smi takes a timeout, which must not delay any job.
        for row in rows:
            if row.action == "drain" and self.artifacts is not None:
                self.diagnostics.submit(self._diagnose, row)

    def _diagnose(self, row: DecisionRow) -> None:
        """Collect diagnostics on the nodes of a drain that ran (or was dry-run), once.

        A courtesy to the human who repairs the node: it never fails the decision, and on this
        worker an exception would vanish with its future, so every one is logged here."""
        assert self.artifacts is not None
        try:
            found = self.ledger.decision(row.id)
            if found is None or found[0].state not in (RECORDED, EXECUTED):
                return
            if any("diagnostics" in e.detail for e in found[1]):
                return  # a restart picked the incident up again: already collected
            try:
                result = self._run(
                    "collect_diagnostics",
                    {
                        "slurmedic_nodes": row.nodes,
                        "slurmedic_incident": row.incident,
                        # its gres: how many GPUs each node should show
                        "slurmedic_slurm_env": self.slurm_env,
                    },
                    check=row.mode == "monitor" or self.force_monitor(),
                )
                note = keep(result, self.artifacts, row.incident)
            except Exception as e:
                log.exception("diagnostics for decision %s failed", row.id)
                note = {"error": repr(e)[:500]}
            self.ledger.add_note(row.id, {"by": "executor", "diagnostics": note}, self.clock())
        except Exception:
            log.exception("recording diagnostics for decision %s failed", row.id)

    def _drains_first(self, row: DecisionRow) -> str | None:
        """For a requeue or stop: None to go ahead, "wait" while the incident's drain is still
        undecided or running, or why it must fail (the drain failed)."""
        if row.action not in JOB_ACTIONS:
            return None
        drains = [r for r in self.ledger.incident_decisions(row.incident) if r.action == "drain"]
        if any(d.state in WAITING for d in drains):
            return "wait"
        failed = [d.id for d in drains if d.state == FAILED]
        return f"drain (decision {failed[0]}) failed first" if failed else None

    def _move(self, row: DecisionRow, state: str, detail: dict[str, Any]) -> bool:
        """Record a state change; False when the lifecycle refuses it (the decision was
        superseded, or another step moved it first)."""
        try:
            self.ledger.add_event(row.id, state, detail, self.clock())
        except IllegalTransition as e:
            log.info("decision %s not moved to %s: %s", row.id, state, e)
            return False
        return True

    def _run_one(self, row: DecisionRow) -> bool:
        target = playbook_for(row, self.repairs)
        monitor = row.mode == "monitor" or self.force_monitor()
        if row.state == AWAITING_APPROVAL and not monitor:
            if target is not None:
                self._preview(row, *target)
            return True  # a preview never fails the incident's other decisions
        if not monitor:
            blocked = self._drains_first(row)
            if blocked == "wait":
                return True  # picked up again once the drain is decided and done
            if blocked is not None:
                self._move(row, FAILED, {"by": "executor", "error": blocked})
                return False
        if target is None:  # escalate / none: nothing to run
            # `none` is recorded whatever the mode: there is nothing to carry out.
            # An escalation is carried out by telling people (the notifier), in approve mode
            # as in enforce mode.
            done = row.action != "none" and not monitor
            self._move(
                row,
                EXECUTED if done else RECORDED,
                {"by": "executor", "note": "no scheduler action"},
            )
            return True
        name, evars = target
        evars = {**evars, "slurmedic_slurm_env": self.slurm_env}
        if self.fence is not None:
            evars["slurmedic_fence"] = str(self.fence)
        if not monitor and not self._move(row, RUNNING, self._claim(row, name)):
            return True  # superseded before it ran: nothing to do, nothing failed
        if monitor and self._current(row) not in (RECORDED, PENDING, APPROVED):
            return True  # superseded (or moved on) before its dry run
        # A health check runs as long as the policy lets it (and its playbook's own steps).
        timeout = (
            int(self.repairs.health_check_timeout.total_seconds()) + self.timeout
            if row.action == "health_check"
            else None
        )
        try:
            result = self._run(name, evars, check=monitor, timeout=timeout)
        except ValidationError as e:
            self._move(row, FAILED, {"by": "executor", "error": str(e)[:500]})
            return False
        if result.fenced:
            # Its lease may have ended: left `running`, for whoever leads to run again.
            raise LostLease(f"decision {row.id} not carried out: its acts were fenced")
        if not monitor and (mismatch := _mismatch(row, result)):
            # Unfenced: a leader whose stale act got through records what it did all the same.
            self.ledger.record_mismatch(row.id, mismatch, self.clock())
            log.error("decision %s %s: %s", row.id, row.action, mismatch)
        if monitor:
            state = RECORDED
            note = {"by": "executor", "dry_run": result.summary()}
            if self.force_monitor() and row.mode != "monitor":
                note["note"] = "global switch to monitor: dry run only"
        else:
            state = EXECUTED if result.ok else FAILED
            note = {"by": "executor", "run": result.summary()}
        self._move(row, state, note)
        log.info("decision %s %s %s: %s", row.id, row.action, state, "; ".join(result.commands))
        return result.ok

    def _claim(self, row: DecisionRow, name: str) -> dict[str, Any]:
        """What a claim for a run records: which attempt it is, by which leader's term (a run
        an earlier term left `running` is run again, and the ledger says so)."""
        found = self.ledger.decision(row.id)
        attempt = 1 + sum(e.state == RUNNING for e in found[1]) if found else 1
        claim: dict[str, Any] = {"by": "executor", "playbook": name, "attempt": attempt}
        if (term := self.ledger.term) is not None:
            claim |= {"replica": term.holder, "term": term.token}
        return claim

    def _preview(self, row: DecisionRow, name: str, evars: dict[str, Any]) -> None:
        """The dry run of a decision waiting for approval, kept as a note: what the approver
        reads before saying yes."""
        evars = {**evars, "slurmedic_slurm_env": self.slurm_env}
        try:
            note: dict[str, Any] = {"dry_run": self._run(name, evars, check=True).summary()}
        except ValidationError as e:
            note = {"error": str(e)[:500]}
        self.ledger.add_note(row.id, {"by": "executor", **note}, self.clock())
        log.info("decision %s %s awaits approval: dry run recorded", row.id, row.action)

    def _current(self, row: DecisionRow) -> str:
        found = self.ledger.decision(row.id)
        return found[0].state if found else ""

    def _failed(self, row: DecisionRow) -> bool:
        """Whether the ledger holds the decision failed; False when it cannot say (it is read
        again on a later step)."""
        try:
            return self._current(row) == FAILED
        except Exception:
            log.exception("decision %s: its state could not be read", row.id)
            return False

    def _run(
        self, name: str, evars: dict[str, Any], *, check: bool, timeout: int | None = None
    ) -> RunResult:
        def transient(r: RunResult) -> bool:
            return not r.ok and (r.fenced or bool(TRANSIENT.search(r.output)))

        attempts: list[str] = []

        def attempt() -> RunResult:
            term = self.ledger.term
            if attempts and term is not None and not self.ledger.leases.is_current(term):
                raise LostLease("no retry: this term has ended")
            r = run_playbook(
                name,
                evars,
                check=check,
                inventory=self.inventory,
                timeout=timeout or self.timeout,
                group=self.group,
            )
            attempts.append(
                "fenced" if r.fenced else "transient Slurm error" if transient(r) else r.status
            )
            return r

        retrying = Retrying(
            retry=retry_if_result(transient),
            stop=stop_after_attempt(self.retries),
            wait=wait_exponential(multiplier=self.backoff, max=8),
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
            before_sleep=lambda state: log.warning(
                "%s: transient Slurm error (attempt %d), retrying", name, state.attempt_number
            ),
        )
        result: RunResult = retrying(attempt)
        result.attempts = attempts
        return result

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.diagnostics.shutdown(wait=True)

    def abandon(self) -> None:
        """The leader's term ended: what has not started never will (the next leader picks it
        up from the ledger); a playbook already running finishes and records its result."""
        self.abandoned = True
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.diagnostics.shutdown(wait=False, cancel_futures=True)
