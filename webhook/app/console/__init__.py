"""The review console: incidents, the approval queue, an incident's evidence, timeline and exact
commands, approvals and verdicts, in the browser.

Pages are rendered on the server (Jinja2, autoescaped) with the package's own stylesheet: no
CDN, no script, so it works on an air-gapped cluster. Every form carries a CSRF token
(Flask-WTF); reads need a viewer, approvals an approver.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import (
    Blueprint,
    abort,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)

from webhook.adapters.prometheus import Prometheus
from webhook.app.console import drills as drill_form
from webhook.app.console.auth import UsersError, check_login, current, require, settings
from webhook.backtest.report import WORDS
from webhook.core import disruption, trial
from webhook.core.changes import Change, changes
from webhook.core.incidents import drain_reason
from webhook.core.lifecycle import APPROVED, AWAITING_APPROVAL, REJECTED, STATES
from webhook.core.patterns import NODE_NAME
from webhook.core.policy import ACTIONS, CAUSES, MODES
from webhook.core.validation import is_number
from webhook.core.verdicts import JUDGEMENTS, MEANS, WOULD, VerdictError, verdict
from webhook.ledger import review
from webhook.ledger.schema import DecisionEvent, DecisionRow
from webhook.ledger.schema import utc as in_utc
from webhook.ledger.settings import Breaker, CorruptSetting, Modes, S, Switch, Unmatched
from webhook.ledger.store import Ledger, last_dry_run
from webhook.rules.delays import delays_for

console = Blueprint(
    "console",
    __name__,
    url_prefix="/console",
    template_folder="templates",
    static_folder="static",
)
PARTITION = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# Within an incident the drain comes first: a human approving it all approves in this order.
ORDER = {"drain": 0, "resume": 0, "requeue": 1, "stop": 1}


def ledger() -> Ledger:
    ledger: Ledger = current_app.extensions["slurmedic"]["ledger"]
    return ledger


def now() -> datetime:
    return datetime.now(UTC)


@console.app_template_filter("age")
def age(dt: datetime) -> str:
    seconds = int((now() - in_utc(dt)).total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d"


@console.app_template_filter("utc")
def utc(dt: datetime) -> str:
    return in_utc(dt).strftime("%Y-%m-%d %H:%M:%SZ")


@console.context_processor
def identity() -> dict[str, Any]:
    return {"who": current()}


# ---- login ---------------------------------------------------------------------------------
@console.route("/login", methods=["GET", "POST"])
def login() -> Any:
    if settings().proxy_user_header:
        abort(404, "the console's users come from the reverse proxy")
    error = ""
    if request.method == "POST":
        try:
            who = check_login(request.form.get("user", ""), request.form.get("password", ""))
        except UsersError as e:
            current_app.logger.error("console login: %s", e)
            abort(503, "the console's users file does not load (the log says why)")
        if who is None:
            error = "unknown user or wrong password"
        else:
            session.clear()
            session["user"], session["role"] = who.name, who.role
            target = request.args.get("next", "")
            # Only a path of this console: never an address elsewhere.
            if not target.startswith("/console/") or target.startswith("//"):
                target = url_for("console.incidents")
            return redirect(target)
    return render_template("console/login.html", error=error), 401 if error else 200


@console.route("/logout", methods=["POST"])
def logout() -> Any:
    session.clear()
    return redirect(url_for("console.login"))


# ---- incidents -----------------------------------------------------------------------------
def _filter() -> review.IncidentFilter:
    a = request.args
    choices = {"state": STATES, "cause": CAUSES, "action": ACTIONS, "mode": MODES}
    picked: dict[str, Any] = {}
    for key, allowed in choices.items():
        value = a.get(key, "")
        if value and value not in allowed:
            abort(400, f"{key}: {value!r} is not one of {', '.join(sorted(allowed))}")
        picked[key] = value or None
    job = a.get("job", "").strip()
    if job and not is_number(job):
        abort(400, f"job: {job!r} is not a job id")
    node = a.get("node", "").strip()
    if node and not NODE_NAME.fullmatch(node):
        abort(400, f"node: {node!r} is not a node name")
    partition = a.get("partition", "").strip()
    if partition and not PARTITION.fullmatch(partition):
        abort(400, f"partition: {partition!r} is not a partition name")
    hours = a.get("hours", "").strip()
    if hours and not is_number(hours):
        abort(400, f"hours: {hours!r} is not a whole number of hours")
    since = now() - timedelta(hours=int(hours)) if hours else None
    return review.IncidentFilter(
        **picked,
        job=int(job) if job else None,
        partition=partition or None,
        node=node or None,
        since=since,
    )


@console.route("/")
@require("viewer")
def incidents() -> Any:
    f = _filter()
    page = request.args.get("page", "1")
    if not is_number(page) or int(page) < 1:
        abort(400, f"page: {page!r} is not a page number")
    size = settings().page_size
    found = review.incident_page(ledger(), f, (int(page) - 1) * size, size)
    decisions = review.decisions_of(ledger(), found.keys)
    verdicts = review.verdicts_of(ledger(), [d.id for ds in decisions.values() for d in ds])
    waiting = review.waiting_since(ledger(), [AWAITING_APPROVAL])
    args = {k: v for k, v in request.args.items() if k != "page" and v}
    return render_template(
        "console/incidents.html",
        status=_status(),
        keys=found.keys,
        decisions=decisions,
        facts={k: _facts(decisions[k], verdicts) for k in found.keys},
        total=found.total,
        page=int(page),
        pages=max(1, -(-found.total // size)),
        args=args,
        waiting=waiting,
        choices={"state": sorted(STATES), "cause": CAUSES, "action": ACTIONS, "mode": MODES},
    )


def _facts(rows: list[DecisionRow], verdicts: dict[int, list[Any]]) -> dict[str, Any]:
    """What tells an incident's row from its neighbours: the nodes it names (where it failed,
    what it drains or excludes, else its alerts' nodes), its alerts' names, and how many of its
    decisions (superseded ones left out) have a verdict."""
    live = [d for d in rows if d.state != "superseded"] or rows
    nodes = [n for d in live for n in (*(d.failed_on or ()), *d.nodes, *d.exclude)]
    evidence = [e for d in live for e in d.evidence if isinstance(e, dict)]
    nodes = nodes or [str(e["node"]) for e in evidence if e.get("node")]
    return {
        "nodes": list(dict.fromkeys(nodes)),
        "signals": list(dict.fromkeys(str(e["alertname"]) for e in evidence if "alertname" in e)),
        "judged": sum(1 for d in live if verdicts.get(d.id)),
        "decisions": len(live),
    }


def _status() -> dict[str, Any]:
    """The switch, the breaker and the modes the loop decides with (settings in the ledger; a
    corrupt one reads as its defaults here, the loop says why in its log)."""

    def read(kind: type[S]) -> S:
        try:
            return ledger().setting(kind)
        except CorruptSetting:
            return kind()

    return {
        "switch": read(Switch),
        "breaker": read(Breaker),
        "modes": read(Modes),
        "unmatched": read(Unmatched),
    }


@console.route("/switch", methods=["POST"])
@require("admin")
def switch() -> Any:
    to = request.form.get("to", "")
    if to not in ("monitor", "policy"):
        abort(400, f"to: {to!r} is not monitor or policy")
    ledger().put(Switch(monitor=to == "monitor"), now())
    current_app.logger.warning("console: %s set the global switch to %s", g.user.name, to)
    flash(f"global switch: {to}" + (" (every action a dry run)" if to == "monitor" else ""), "ok")
    return redirect(url_for("console.incidents"))


@console.route("/breaker/reset", methods=["POST"])
@require("admin")
def reset_breaker() -> Any:
    at = now()
    ledger().put(Breaker(open=False, reset_at=at), at)
    current_app.logger.warning("console: %s reset the breaker", g.user.name)
    flash("breaker reset: drains before now no longer count", "ok")
    return redirect(url_for("console.incidents"))


@console.route("/report")
@require("viewer")
def trial_report() -> Any:
    """The trial report (as `slurmedic trial report`), over the last `days` days."""
    days = request.args.get("days", "7")
    if not is_number(days) or not 1 <= int(days) <= 3650:
        abort(400, f"days: {days!r} is not a whole number of days from 1 to 3650")
    until = now()
    since = until - timedelta(days=int(days))
    rows = review.trial_rows(ledger(), since, until)
    drilled = [d.as_trial() for d in ledger().drills.between(since, until)]
    url = _prometheus_url()
    delays, source = delays_for(Prometheus(url, timeout=3, retries=0) if url else None)
    return render_template(
        "console/report.html",
        report=trial.report(rows, since, until, drills=drilled, delays=delays, delays_from=source),
        lost_work=trial.lost_work,
        days=int(days),
        harmful=trial.harmful,
        missed=trial.missed,
        effects=trial.EFFECT_WORDS,
    )


def _prometheus_url() -> str | None:
    url: str | None = current_app.extensions["slurmedic"].get("prometheus_url")
    return url


@console.route("/drills")
@require("viewer")
def drills() -> Any:
    """The latest recovery drills and what became of each (`slurmedic drills`); approvers
    also find the form that asks for one."""
    return render_template(
        "console/drills.html",
        rows=ledger().drills.latest(100),
        outcome=trial.drill_outcome,
        timed=_prometheus_url() is not None,
    )


@console.route("/drills/ask", methods=["POST"])
@require("approver")
def ask_drill() -> Any:
    """A drill asked for as `slurmedic drill JOB` asks: the leader's loop plans it."""
    at = now()
    try:
        asked = drill_form.parse(request.form, _prometheus_url(), at)
    except drill_form.FormError as e:
        abort(e.status, str(e))
    drill_id = ledger().drills.ask(asked.job, g.user.name, at, asked.not_before, asked.exclude)
    current_app.logger.warning(
        "console: %s asked for drill %d of job %d", g.user.name, drill_id, asked.job
    )
    when = "now" if asked.not_before <= at else f"at {asked.not_before:%H:%M:%S} UTC"
    flash(f"drill {drill_id} of job {asked.job} asked for {when}: the leader's loop plans it", "ok")
    return redirect(url_for("console.drills"))


@console.route("/nodes")
@require("viewer")
def nodes() -> Any:
    """Each node's failures over the last `days` days beside its repairs (why it left service,
    since when, each repair and its steps), the nodes waiting for replacement first, then the
    lemons (`slurmedic nodes`, `slurmedic repairs`)."""
    days = request.args.get("days", "30")
    if not is_number(days) or not 1 <= int(days) <= 3650:
        abort(400, f"days: {days!r} is not a whole number of days from 1 to 3650")
    rows = review.node_views(ledger(), now() - timedelta(days=int(days)))
    return render_template("console/nodes.html", rows=rows, days=int(days))


@console.route("/backtests")
@require("viewer")
def backtests() -> Any:
    """The backtests kept (`slurmedic backtest --save`), newest first."""
    return render_template("console/backtests.html", rows=ledger().backtests())


@console.route("/backtest/<int:backtest_id>")
@require("viewer")
def backtest(backtest_id: int) -> Any:
    """One backtest: counts, each incident beside what happened, what people did that no
    alert reported, and what could not be reconstructed."""
    row = ledger().backtest(backtest_id)
    if row is None:
        abort(404, f"no backtest {backtest_id}")
    return render_template("console/backtest.html", row=row, report=row.report, words=WORDS)


def _timeline(
    record: review.IncidentRecord, alerts: dict[str, dict[str, Any]]
) -> list[tuple[datetime, str, str]]:
    """Everything that happened to the incident, in order: (when, what, detail)."""
    items: list[tuple[datetime, str, str]] = []
    seen: set[str] = set()
    for d in record.decisions:
        for e in d.evidence:
            if e.get("fingerprint") in seen or "startsAt" not in e:
                continue
            seen.add(e.get("fingerprint", ""))
            started = datetime.fromisoformat(str(e["startsAt"]).replace("Z", "+00:00"))
            items.append((started, "alert", f"{e.get('alertname', '')} on {e.get('node') or '-'}"))
    for d in record.decisions:
        for ev in record.events.get(d.id, []):
            items.append((in_utc(ev.at), _event_kind(ev), f"{d.action} #{d.id}: {_event_text(ev)}"))
        for v in record.verdicts.get(d.id, []):
            alt = f" (would {v.would})" if v.would else ""
            items.append((in_utc(v.at), "verdict", f"{d.action} #{d.id}: {v.by} {v.verdict}{alt}"))
    if (r := record.recovery) is not None and r.decided_at is not None:
        items.append((in_utc(r.decided_at), "verification", f"recovery {r.state}: {r.reason}"))
    return sorted(items, key=lambda i: i[0])


def _event_kind(ev: DecisionEvent) -> str:
    if "dry_run" in ev.detail:
        return "dry run"
    if "run" in ev.detail:
        return "execution"
    if "diagnostics" in ev.detail:
        return "diagnostics"
    if ev.state in (APPROVED, REJECTED):
        return ev.state
    if "recovery" in ev.detail or ev.detail.get("by") == "verifier":
        return "verification"
    return "decided" if ev.detail.get("by") == "engine" else ev.state


def _event_text(ev: DecisionEvent) -> str:
    d = ev.detail
    if isinstance(dry := d.get("dry_run"), dict):
        n = len(dry.get("commands", []))
        return f"{dry.get('playbook', '')} in check mode: {dry.get('status', '')}, {n} command(s)"
    if "diagnostics" in d:
        nodes = (d["diagnostics"] or {}).get("nodes", {})
        verdicts = ", ".join(f"{k} {v.get('verdict', 'unknown')}" for k, v in sorted(nodes.items()))
        return f"diagnostics collected: {verdicts or d['diagnostics'].get('error', '')}"
    parts = [ev.state, f"by {d['by']}" if "by" in d else ""]
    if "reason" in d:
        parts.append(f"({d['reason']})")
    run = d.get("dry_run") or d.get("run")
    if isinstance(run, dict):
        parts.append(f"{run.get('playbook', '')}: {run.get('status', '')}")
    if "error" in d:
        parts.append(f"error: {d['error']}")
    if "note" in d:
        parts.append(str(d["note"]))
    return " ".join(p for p in parts if p)


def _runs(events: Iterable[DecisionEvent]) -> list[dict[str, Any]]:
    """Each playbook run of a decision (dry runs and real ones), newest last."""
    out = []
    for ev in events:
        for kind in ("dry_run", "run"):
            run = ev.detail.get(kind)
            if isinstance(run, dict):
                out.append({"kind": kind, "at": ev.at, **run})
    return out


def _changes(d: DecisionRow, events: Iterable[DecisionEvent]) -> list[Change]:
    """What the latest run (or dry run) of the decision changes in Slurm, before -> after."""
    runs = _runs(events)
    if not runs:
        return []
    return changes(d.action, drain_reason(d.incident, d.cause, d.note or ""), runs[-1])


def _diagnostics(events: Iterable[DecisionEvent]) -> dict[str, Any] | None:
    found = [ev.detail["diagnostics"] for ev in events if "diagnostics" in ev.detail]
    return found[-1] if found else None


@console.route("/incident/<path:key>")
@require("viewer")
def incident(key: str) -> Any:
    record = review.incident_record(ledger(), key)
    if record is None:
        abort(404, f"incident {key!r} is not in the ledger")
    fingerprints = sorted(
        {e["fingerprint"] for d in record.decisions for e in d.evidence if "fingerprint" in e}
    )
    alerts = review.alerts_by_fingerprint(ledger(), fingerprints)
    current_rows = [d for d in record.decisions if d.state != "superseded"]
    first = current_rows[0] if current_rows else record.decisions[-1]
    return render_template(
        "console/incident.html",
        key=key,
        record=record,
        first=first,
        alerts=alerts,
        timeline=_timeline(record, alerts),
        runs={d.id: _runs(record.events.get(d.id, [])) for d in record.decisions},
        commands={d.id: last_dry_run(record.events.get(d.id, [])) for d in record.decisions},
        changes={d.id: _changes(d, record.events.get(d.id, [])) for d in record.decisions},
        diagnostics={d.id: _diagnostics(record.events.get(d.id, [])) for d in record.decisions},
        waiting=[d for d in record.decisions if d.state == AWAITING_APPROVAL],
        judgements=JUDGEMENTS,
        describe=disruption.describe,
        would=WOULD,
        means=MEANS,
        dashboard=settings().dashboard_link(first.job, first.nodes[0] if first.nodes else None),
    )


# ---- approvals and verdicts ----------------------------------------------------------------
def _judge(rows: list[DecisionRow], state: str) -> None:
    reason = request.form.get("reason", "").strip()
    if state == REJECTED and not reason:
        abort(400, "reason: a rejection says why")
    if len(reason) > 2000:
        abort(400, "reason: at most 2000 characters")
    detail = {"by": g.user.name, "via": "console", **({"reason": reason} if reason else {})}
    for row in sorted(rows, key=lambda r: (ORDER.get(r.action, 2), r.id)):
        try:
            review.judge(ledger(), row.id, state, detail, now())
            flash(f"{row.action} #{row.id} {state}", "ok")
        except review.NotWaiting as e:
            flash(str(e), "error")


@console.route("/incident/<path:key>/<any(approve, reject):verb>", methods=["POST"])
@require("approver")
def judge_incident(key: str, verb: str) -> Any:
    record = review.incident_record(ledger(), key)
    if record is None:
        abort(404, f"incident {key!r} is not in the ledger")
    waiting = [d for d in record.decisions if d.state == AWAITING_APPROVAL]
    if not waiting:
        abort(409, f"nothing of incident {key!r} awaits approval")
    _judge(waiting, APPROVED if verb == "approve" else REJECTED)
    return redirect(url_for("console.incident", key=key))


def _decision(decision_id: int) -> DecisionRow:
    found = ledger().decision(decision_id)
    if found is None:
        abort(404, f"decision {decision_id} is not in the ledger")
    return found[0]


@console.route("/decision/<int:decision_id>/<any(approve, reject):verb>", methods=["POST"])
@require("approver")
def judge_decision(decision_id: int, verb: str) -> Any:
    row = _decision(decision_id)
    _judge([row], APPROVED if verb == "approve" else REJECTED)
    return redirect(url_for("console.incident", key=row.incident))


@console.route("/decision/<int:decision_id>/verdict", methods=["POST"])
@require("viewer")
def record_verdict(decision_id: int) -> Any:
    row = _decision(decision_id)
    form = request.form
    try:
        v = verdict(
            verdict=form.get("verdict", ""),
            would=form.get("would") or None,
            note=form.get("note", "").strip(),
            by=g.user.name,
        )
    except VerdictError as e:
        abort(400, str(e))
    review.add_verdict(ledger(), decision_id, v, now())
    flash(f"verdict on {row.action} #{row.id}: {v.verdict}", "ok")
    return redirect(url_for("console.incident", key=row.incident))
