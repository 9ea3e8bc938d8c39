"""The PromQL of slurmedic's Grafana dashboards (`dashboards/*.json`), ready to run.

`queries()` returns every panel target's expression (and every query variable's selector) with
Grafana's variables filled in, so that tools without Grafana can check them: the unit tests parse
them with promtool and check their metric names, a lab test runs them against a real Prometheus.
`metric_names()` lists the metric names an expression reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook import resources
from webhook.core.validation import is_number

DASHBOARDS_DIR = resources.DASHBOARDS

# Grafana's global variables, with values a query would plausibly get.
GRAFANA_BUILTINS = {
    "__interval": "30s",
    "__interval_ms": "30000",
    "__rate_interval": "2m",
    "__rate_interval_ms": "120000",
    "__range": "1d",
    "__range_s": "86400",
    "__range_ms": "86400000",
}

# ${name}, ${name:format}, $name, [[name]], [[name:format]] (Grafana's variable syntaxes).
_VARIABLE = re.compile(
    r"\$\{(?P<braced>\w+)(?::[^}]*)?\}|\$(?P<plain>\w+)|\[\[(?P<old>\w+)(?::[^\]]*)?\]\]"
)
_LABEL_VALUES = re.compile(
    r"^\s*label_values\(\s*(?P<selector>.+),\s*(?P<label>\w+)\s*\)\s*$", re.S
)
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.+)\)\s*$", re.S)


class DashboardError(ValueError):
    """A dashboard that cannot be turned into queries; the message names the place."""


@dataclass(frozen=True)
class Query:
    dashboard: str  # the dashboard's uid
    panel_id: int | None  # None for a template variable's query
    title: str  # the panel's title, or "variable NAME"
    ref_id: str
    expr: str  # with the variables filled in
    raw: str  # as written in the dashboard
    instant: bool


def dashboards(directory: Path = DASHBOARDS_DIR) -> list[Path]:
    return sorted(directory.glob("*.json"))


def substitute(expr: str, values: dict[str, str], where: str = "query") -> str:
    """`expr` with every Grafana variable replaced by its value from `values`.

    `$1`-style references (label_replace's capture groups) are not variables and stay; any other
    variable without a value is an error, as Grafana would send it to Prometheus unreplaced.
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("plain") or match.group("old")
        if name in values:
            return values[name]
        if is_number(name):
            return match.group(0)
        raise DashboardError(f"{where}: no value for variable ${name}")

    return _VARIABLE.sub(replace, expr)


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    out = []
    for panel in panels:
        out.append(panel)
        out += _panels(panel.get("panels", []))
    return out


def _variable_query(variable: dict[str, Any]) -> str | None:
    """The PromQL behind a query variable: the selector of label_values(), query_result()."""
    query = variable.get("query")
    text = query.get("query", "") if isinstance(query, dict) else str(query or "")
    if m := _LABEL_VALUES.match(text):
        return m.group("selector")
    if m := _QUERY_RESULT.match(text):
        return m.group("expr")
    return None  # label_values(label), label_names(), metrics(): no PromQL


def queries(path: Path, variables: dict[str, str] | None = None) -> list[Query]:
    """Every PromQL expression of the dashboard at `path`, variables filled in.

    `variables` gives values for the dashboard's variables (e.g. {"slurm_job_id": "4242"}); a
    variable without one takes its current value in the dashboard (interval variables have
    one), Grafana's global ones (`$__rate_interval`, `$__range`, ...) take GRAFANA_BUILTINS.
    """
    try:
        board = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DashboardError(f"{path.name}: not JSON: {e}") from e
    uid = str(board.get("uid", path.stem))
    values = dict(GRAFANA_BUILTINS)
    for var in board.get("templating", {}).get("list", []):
        current = (var.get("current") or {}).get("value")
        if isinstance(current, str) and current and not current.startswith("$"):
            values[var["name"]] = current
    values.update(variables or {})
    out = []
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") != "query" or (raw := _variable_query(var)) is None:
            continue
        where = f"{path.name}: variable {var['name']}"
        expr = substitute(raw, values, where)
        out.append(Query(uid, None, f"variable {var['name']}", "", expr, raw, True))
    for panel in _panels(board.get("panels", [])):
        for target in panel.get("targets", []):
            raw = target.get("expr", "")
            where = (
                f"{path.name}: panel {panel.get('id')} {panel.get('title')!r} {target.get('refId')}"
            )
            out.append(
                Query(
                    dashboard=uid,
                    panel_id=panel.get("id"),
                    title=str(panel.get("title", "")),
                    ref_id=str(target.get("refId", "")),
                    expr=substitute(raw, values, where),
                    raw=raw,
                    instant=bool(target.get("instant")),
                )
            )
    return out


# --- metric names ---------------------------------------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^}]*\}")
_BRACKETS = re.compile(r"\[[^\]]*\]")
_MODIFIERS = re.compile(r"\b(?:offset\s+-?[\w.]+|@\s*[\w.()]+)", re.I)
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.I)
_NUMBERS = re.compile(r"(?<![\w:])(?:0x[0-9a-f]+|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)", re.I)
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
    "start",
    "end",
}


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects (`foo` and `foo{...}`; not `{__name__=...}`).

    A lexical reading, good for the plain PromQL of rules and dashboards: strings, label
    matchers, ranges, modifiers, grouping clauses and numbers are dropped; of what is left, an
    identifier that is not a keyword and not followed by `(` (a function or an aggregation) is a
    metric name.
    """
    text = _STRINGS.sub(" ", expr)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _MODIFIERS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBERS.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        name = m.group(0)
        if name.lower() in _KEYWORDS or text[m.end() :].lstrip().startswith("("):
            continue
        names.add(name)
    return names
