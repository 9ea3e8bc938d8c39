"""The backtest report in the trial report's formats: markdown, csv, json (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from webhook.backtest.compare import (
    AGREE,
    EXTRA,
    HANDED,
    MISS,
    SAME,
    Happened,
    IncidentRow,
    Report,
    Verdict,
)
from webhook.backtest.history import iso, span_text

WORDS = {
    AGREE: "agrees",
    MISS: "miss",
    EXTRA: "possible false positive",
    HANDED: "handed to a person",
    SAME: "already decided",
}


def _t(at: datetime | None) -> str | None:
    return iso(at) if at is not None else None


def _s(d: timedelta | None) -> int | None:
    return round(d.total_seconds()) if d is not None else None


def _happened(h: Happened) -> dict[str, Any]:
    return {"at": _t(h.at), "what": h.what, "by": h.by, "nodes": list(h.nodes), "detail": h.detail}


def _verdict(v: Verdict) -> dict[str, Any]:
    return {
        "verdict": v.kind,
        "action": v.action,
        "nodes": list(v.nodes),
        "would_at": _t(v.would_at),
        "did_at": _t(v.did_at),
        "gained_s": _s(v.gained),
        "gpu_hours_saved": v.gpu_hours,
        "note": v.note,
    }


def _incident(row: IncidentRow) -> dict[str, Any]:
    a = row.attempt
    return {
        "incident": row.incident,
        "job": row.job,
        "job_name": a.name if a else None,
        "user": a.user if a else None,
        "nodes": list(a.nodes) if a else [],
        "attempt_state": a.state if a else None,
        "fault_at": _t(row.fault_at),
        "cause": row.cause,
        "would": [
            {
                "at": _t(d.at),
                "action": d.action,
                "nodes": sorted(d.nodes),
                "exclude": sorted(d.exclude),
                "cause": d.cause,
                "guard": d.guard,
            }
            for d in row.decisions
        ],
        "happened": [_happened(h) for h in row.happened],
        "verdicts": [_verdict(v) for v in row.verdicts],
    }


def as_json(report: Report) -> dict[str, Any]:
    return {
        "from": _t(report.start),
        "to": _t(report.until),
        "sources": report.sources,
        "counts": report.counts(),
        "incidents": [_incident(r) for r in report.incidents],
        "unanswered": [
            {**_happened(u.happened), "attempt": u.attempt.key if u.attempt else None}
            for u in report.unanswered
        ],
        "limits": report.limits,
    }


CSV_HEADER = (
    "incident",
    "job",
    "fault_at",
    "cause",
    "action",
    "nodes",
    "verdict",
    "would_at",
    "did_at",
    "gained_s",
    "gpu_hours_saved",
    "note",
)


def csv_rows(report: Report) -> list[list[Any]]:
    """One row per verdict; people's actions no incident answers are rows of their own."""
    rows: list[list[Any]] = [list(CSV_HEADER)]
    for r in report.incidents:
        for v in r.verdicts or [Verdict("", "")]:
            rows.append(
                [
                    r.incident,
                    r.job or "",
                    _t(r.fault_at),
                    r.cause,
                    v.action,
                    " ".join(v.nodes),
                    v.kind,
                    _t(v.would_at) or "",
                    _t(v.did_at) or "",
                    _s(v.gained) or "",
                    v.gpu_hours or "",
                    v.note,
                ]
            )
    for u in report.unanswered:
        h = u.happened
        rows.append(
            [
                "",
                u.attempt.job if u.attempt else "",
                "",
                "",
                h.what,
                " ".join(h.nodes),
                MISS,
                "",
                _t(h.at),
                "",
                "",
                f"no alert; {h.by or 'someone'} {h.what} {h.detail}".strip(),
            ]
        )
    return rows


def _ago(d: timedelta | None) -> str:
    return "" if d is None else span_text(d, plus="+")


def as_markdown(report: Report) -> str:
    c = report.counts()
    out = [
        f"# Backtest: {iso(report.start)} .. {iso(report.until)}",
        "",
        "What slurmedic would have done with this policy, beside what happened.",
        "",
        "| | |",
        "|---|---|",
        f"| incidents | {c['incidents']} ({c['decisions']} decisions) |",
        f"| agreed with what happened | {c['agreed']} |",
        f"| misses (people acted, slurmedic would not have) | {c['misses']} |",
        f"| possible false positives (slurmedic would have, nobody did) | "
        f"{c['possible_false_positives']} |",
        f"| handed to a person | {c['escalated']} |",
        f"| agreement | {_pct(c['agreement'])} |",
        f"| drains sooner / requeues sooner | {c['drains_sooner']} / {c['requeues_sooner']} |",
        f"| time gained (sum, median) | {_dur(c['time_gained_s'])}, {_dur(c['median_gain_s'])} |",
        f"| GPU-hours that would have been saved | {c['gpu_hours_saved']} |",
        "",
        "## Incidents",
        "",
    ]
    if not report.incidents:
        out += ["No incident in the span.", ""]
    for r in report.incidents:
        what = f"job {r.job}" + (f" ({r.attempt.name}, {r.attempt.user})" if r.attempt else "")
        out += [f"### {r.incident}: {what if r.job else 'node'}, {r.cause}", ""]
        out.append(f"- fault: {iso(r.fault_at)}")
        for d in r.decisions:
            target = " ".join(sorted(d.nodes)) or (
                f"excluding {' '.join(sorted(d.exclude))}" if d.exclude else ""
            )
            guard = f" (guard: {d.guard})" if d.guard else ""
            out.append(
                f"- slurmedic would: **{d.action}** {target} at {iso(d.at)} "
                f"({_ago(d.at - r.fault_at)}){guard}".replace("  ", " ")
            )
        for h in r.happened:
            who = f" by {h.by}" if h.by else ""
            nodes = f" {' '.join(h.nodes)}" if h.nodes else ""
            detail = f": {h.detail}" if h.detail else ""
            out.append(
                f"- happened: {h.what}{nodes}{who} at {iso(h.at)} "
                f"({_ago(h.at - r.fault_at)}){detail}"
            )
        for v in r.verdicts:
            gain = f", {_ago(v.gained)} sooner" if v.gained and v.gained.total_seconds() > 0 else ""
            hours = f", {v.gpu_hours} GPU-hours" if v.gpu_hours else ""
            nodes = f" {' '.join(v.nodes)}" if v.nodes else ""
            out.append(f"- **{WORDS[v.kind]}**: {v.action}{nodes}{gain}{hours} — {v.note}")
        out.append("")
    out += ["## What people did that no alert reported", ""]
    if not report.unanswered:
        out.append("Nothing.")
    for u in report.unanswered:
        h = u.happened
        job = f" job {u.attempt.key} ({u.attempt.state})" if u.attempt else ""
        out.append(
            f"- {iso(h.at)}: {h.by or 'someone'} {h.what}{job}"
            f"{' ' + ' '.join(h.nodes) if h.nodes else ''}{': ' + h.detail if h.detail else ''}"
        )
    out += ["", "## What this backtest could not reconstruct", ""]
    out += [f"- {line}" for line in report.limits]
    out += ["", "Sources: " + ", ".join(f"{k} {v}" for k, v in report.sources.items()), ""]
    return "\n".join(out)


def _pct(v: Any) -> str:
    return "n/a (nothing to judge)" if v is None else f"{100 * v:.0f} %"


def _dur(v: Any) -> str:
    return "n/a" if v is None else _ago(timedelta(seconds=v)).lstrip("+")
