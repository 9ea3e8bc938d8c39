"""Grafana dashboards (dashboards/*.json): schema, datasource variable, valid PromQL, real metrics.

No Grafana and no Prometheus server: every expression is parsed by promtool (as a recording rule
of a temporary rule file), and every metric name must be one something here produces: the rule
files' recording rules and their inputs, the exporters the lab serves (same names as the real
ones), the training-progress reporter, slurmedic's own /metrics and Prometheus' built-ins.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab import dcgm_exporter
from lab.slurm_exporter import SlurmCollector
from webhook.adapters.slurm import SlurmNode
from webhook.core.cluster import Job
from webhook.progress import GAUGES
from webhook.rules.dashboards import (
    DASHBOARDS_DIR,
    DashboardError,
    Query,
    dashboards,
    metric_names,
    queries,
    substitute,
)
from webhook.rules.render import RULES_DIR

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"timeseries", "stat", "table", "bargauge"}
EXPECTED = {"goodput.json", "recovery.json", "gpu-health.json"}
VALUES = {"slurm_job_id": "4242", "node": "gpu01"}

# slurmedic's own /metrics: every family webhook/app/metrics.py declares, with its type.
METRICS_SOURCE = Path(__file__).resolve().parents[2] / "webhook" / "app" / "metrics.py"
_DECLARED = re.compile(
    r"\b(?P<kind>Counter|Gauge|Histogram|_histogram)(?:MetricFamily)?\(\s*\"(?P<name>slurmedic_\w+)\""
)
PROMETHEUS_BUILTINS = {"up", "ALERTS", "ALERTS_FOR_STATE"}


def _load(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in panels:
        out += [p, *_panels(p.get("panels", []))]
    return out


def _walk(node: Any) -> list[dict[str, Any]]:
    """Every JSON object in the document."""
    if isinstance(node, dict):
        return [node, *[d for v in node.values() for d in _walk(v)]]
    if isinstance(node, list):
        return [d for v in node for d in _walk(v)]
    return []


def _rule_files() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(RULES_DIR.glob("*.rules.yml"))]


class _NoCluster:
    ok = True

    def nodes(self) -> list[SlurmNode]:
        return [SlurmNode("gpu01", "IDLE", frozenset(), ("train",), gres="gpu:8")]

    def jobs(self) -> list[Job]:
        return []


def slurmedic_metrics() -> set[str]:
    """The series names slurmedic's /metrics exposes (counters as `_total`, histograms as
    `_bucket`, `_sum`, `_count`), from the families its source declares."""
    names = set()
    for m in _DECLARED.finditer(METRICS_SOURCE.read_text()):
        name = m.group("name")
        if m.group("kind") == "Counter":
            names.add(name.removesuffix("_total") + "_total")
        elif m.group("kind") == "Gauge":
            names.add(name)
        else:
            names |= {name + s for s in ("_bucket", "_sum", "_count")}
    return names


def test_slurmedic_metrics_are_read_from_the_service() -> None:
    names = slurmedic_metrics()
    assert {
        "slurmedic_webhook_requests_total",
        "slurmedic_decisions_total",
        "slurmedic_decisions_in_state",
        "slurmedic_job_eligible",
        "slurmedic_work_lost_seconds_bucket",
        "slurmedic_loop_last_tick_timestamp_seconds",
    } <= names


MTAIL_DECLARATION = re.compile(r"^(?:counter|gauge|timer|histogram)\s+(\w+)", re.M)


def produced_metrics() -> set[str]:
    """What the exporters (as the lab serves their names), the mtail program, the training
    progress reporter, slurmedic and Prometheus itself expose, and the recording rules record."""
    names = set(PROMETHEUS_BUILTINS) | slurmedic_metrics()
    names |= {*dcgm_exporter.GAUGES, *dcgm_exporter.COUNTERS, dcgm_exporter.XID_COUNT}
    names |= {f.name for f in SlurmCollector(_NoCluster()).collect()}  # type: ignore[arg-type]
    names |= set(GAUGES)
    names |= set(MTAIL_DECLARATION.findall((RULES_DIR / "mtail" / "training.mtail").read_text()))
    for rules in _rule_files():
        names |= {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    return names


def known_metrics() -> set[str]:
    """Produced metrics, and whatever the rule files read (real exporters' names the lab's fakes
    may not serve)."""
    names = produced_metrics()
    for rules in _rule_files():
        for group in rules["groups"]:
            for rule in group["rules"]:
                names |= metric_names(rule["expr"])
    return names


def test_goodput_and_slurmedic_rules_read_only_metrics_that_exist() -> None:
    produced = produced_metrics()
    for name in ("goodput.rules.yml", "slurmedic.rules.yml"):
        rules = yaml.safe_load((RULES_DIR / name).read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                assert metric_names(rule["expr"]) <= produced, (name, rule.get("record"))


@pytest.fixture(scope="module")
def all_queries() -> list[Query]:
    return [q for p in dashboards() for q in queries(p, VALUES)]


def test_the_three_dashboards_and_their_provisioning_exist() -> None:
    assert {p.name for p in dashboards()} == EXPECTED
    providers = yaml.safe_load((DASHBOARDS_DIR / "provisioning" / "dashboards.yml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    sources = yaml.safe_load((DASHBOARDS_DIR / "provisioning" / "datasource.yml").read_text())
    assert sources["apiVersion"] == 1
    assert [d["type"] for d in sources["datasources"]] == ["prometheus"]
    assert (DASHBOARDS_DIR / "README.md").exists()


@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_schema_fields(path: Path) -> None:
    board = _load(path)
    assert board["id"] is None
    assert re.fullmatch(r"slurmedic-[a-z0-9-]+", board["uid"]), board["uid"]
    assert board["title"].startswith("slurmedic / ")
    assert board["schemaVersion"] >= 39
    assert "slurmedic" in board["tags"]
    assert {"time", "templating", "panels", "links", "annotations"} <= set(board)
    assert board["panels"]


def test_uids_and_titles_are_unique() -> None:
    boards = [_load(p) for p in dashboards()]
    assert len({b["uid"] for b in boards}) == len(boards)
    assert len({b["title"] for b in boards}) == len(boards)


@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_links_reach_the_other_dashboards(path: Path) -> None:
    """A `dashboards` link by the tag every slurmedic dashboard carries: it lists the others."""
    links = _load(path)["links"]
    assert any(
        link["type"] == "dashboards" and link["tags"] == ["slurmedic"] and link["keepTime"]
        for link in links
    )


@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_the_datasource_is_a_variable_everywhere(path: Path) -> None:
    board = _load(path)
    variables = board["templating"]["list"]
    ds = [v for v in variables if v["type"] == "datasource"]
    assert len(ds) == 1 and ds[0]["name"] == "datasource" and ds[0]["query"] == "prometheus"
    for v in variables:
        if v["type"] == "query":
            assert v["datasource"] == DATASOURCE, v["name"]
    for panel in _panels(board["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, (panel["title"], target["refId"])
    # No datasource is named by a site's uid anywhere (the built-in annotation is Grafana's own).
    for obj in _walk(board):
        if "datasource" not in obj:
            continue
        ref = obj["datasource"]
        assert isinstance(ref, dict), obj
        assert ref == DATASOURCE or ref == {"type": "grafana", "uid": "-- Grafana --"}, ref


@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_panels(path: Path) -> None:
    panels = [p for p in _panels(_load(path)["panels"]) if p["type"] != "row"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are not unique"
    cells: set[tuple[int, int]] = set()
    for p in panels:
        assert p["type"] in PANEL_TYPES, (p["title"], p["type"])
        assert p["title"] and p.get("description"), p["id"]
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, p["title"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip(), (p["title"], t["refId"])


def test_every_expression_parses_as_promql(all_queries: list[Query], tmp_path: Path) -> None:
    """promtool parses each query as the expression of a recording rule."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not on PATH (Debian package prometheus; scripts/setup.sh)"
    names = {}
    rules = []
    for i, q in enumerate(all_queries):
        record = f"dashboard:query:{i}"
        names[record] = q
        rules.append({"record": record, "expr": q.expr})
    rule_file = tmp_path / "dashboards.rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    res = subprocess.run(
        [promtool, "check", "rules", str(rule_file)], capture_output=True, text=True
    )
    if res.returncode != 0:
        out = res.stderr + res.stdout
        bad = [
            f"{q.dashboard} {q.title!r} {q.ref_id}: {q.expr}"
            for r, q in names.items()
            if f'"{r}"' in out
        ]
        pytest.fail(f"promtool: {out}\n" + "\n".join(bad))
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout


def test_every_metric_exists(all_queries: list[Query]) -> None:
    known = known_metrics()
    unknown = {
        f"{q.dashboard} {q.title!r} {q.ref_id}: {name}"
        for q in all_queries
        for name in metric_names(q.expr) - known
    }
    assert not unknown, "\n".join(sorted(unknown))


def test_every_dashboard_variable_is_defined_and_every_query_variable_has_a_query() -> None:
    for path in dashboards():
        board = _load(path)
        defined = {v["name"] for v in board["templating"]["list"]}
        used = set(
            re.findall(
                r"\$\{?(\w+)",
                json.dumps([t for p in _panels(board["panels"]) for t in p.get("targets", [])]),
            )
        )
        used = {u for u in used if not u.isdigit() and not u.startswith("__")}
        assert used <= defined, (path.name, used - defined)
        assert len(queries(path, VALUES)) > len(_panels(board["panels"]))


def test_queries_fill_in_variables() -> None:
    qs = queries(DASHBOARDS_DIR / "goodput.json", {"slurm_job_id": "77"})
    table = [q for q in qs if q.title == "Jobs"]
    assert [q.ref_id for q in table] == ["A", "B", "C", "D"]
    assert table[0].raw == 'slurmedic:job_ettr:ratio{slurm_job_id=~"$slurm_job_id"}'
    assert table[0].expr == 'slurmedic:job_ettr:ratio{slurm_job_id=~"77"}' and table[0].instant
    # An interval variable takes its current value in the dashboard; Grafana's own ones defaults.
    assert any("[1d]" in q.expr and "$window" in q.raw for q in qs)
    assert any("[1d]" in q.expr and "$__range" in q.raw for q in qs)
    assert qs[0].title == "variable slurm_job_id" and qs[0].expr == "slurmedic:job_ettr:ratio"


def test_substitute() -> None:
    values = {"node": "gpu0[12]", "__range": "1h"}
    assert substitute('x{node=~"$node"}[$__range]', values) == 'x{node=~"gpu0[12]"}[1h]'
    assert substitute('x{node=~"${node:regex}"}', values) == 'x{node=~"gpu0[12]"}'
    assert substitute('x{node=~"[[node]]"}', values) == 'x{node=~"gpu0[12]"}'
    kept = 'label_replace(x, "node", "$1", "instance", "(.+)")'
    assert substitute(kept, values) == kept
    with pytest.raises(DashboardError, match=r"panel 3: no value for variable \$nodes"):
        substitute('x{node=~"$nodes"}', values, "panel 3")


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('sum by (le) (rate(a_bucket{x="y"}[5m]))', {"a_bucket"}),
        ("histogram_quantile(0.9, sum by (le, action) (rate(b_bucket[$w])))", {"b_bucket"}),
        ('count_values("xid", c > 0) or d offset 5m', {"c", "d"}),
        (
            "max by (slurm_job_id) (time() - e) < bool 120 and on (slurm_job_id) f:g:h == 1",
            {"e", "f:g:h"},
        ),
        ('label_replace(i, "n", "$1", "instance", "([^:]+).*") * 0 + Inf', {"i"}),
        ("j / 1e6 > on (k) group_left () sum(l)", {"j", "l"}),
        ("sum(m) without (instance) unless n @ 1609746000", {"m", "n"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
