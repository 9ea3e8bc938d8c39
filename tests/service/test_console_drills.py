"""Recovery drills in the console, through Flask's test client on a real SQLite ledger: an
approver asks for one (the same request `slurmedic drill` makes), a viewer may not, a bad
field is refused with its reason, a drill timed before the job's next checkpoint reads its
checkpoints from a Prometheus (a small HTTP server here), and the drills page and the trial
report show what became of each drill, apart from the recommendations."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask.testing import FlaskClient

from tests.markdown_tables import check
from tests.service.conftest import console_config
from tests.service.test_console import login, users
from tests.service.test_prometheus_retries import Handler, Scripted
from webhook.app import create_app
from webhook.core import drills
from webhook.core.cluster import ClusterView, Job
from webhook.core.policy import load_policy
from webhook.core.recovery import FailurePoint, Resume, Verdict, Watch
from webhook.core.trial import DRILL_TABLE
from webhook.core.verdicts import verdict
from webhook.ledger import review
from webhook.ledger.store import Ledger

ASK = "/console/drills/ask"


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return users(tmp_path_factory.mktemp("users") / "users.yml")


@pytest.fixture
def prom() -> Iterator[Scripted]:
    server = Scripted(("127.0.0.1", 0), Handler)
    server.requests = []
    server.script = [(200, {"status": "success", "data": {"resultType": "matrix", "result": []}})]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def console(tmp_path: Path, users_file: Path, prometheus: str | None = None) -> FlaskClient:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = console_config(
        tmp_path,
        db,
        users_file,
        **({"verification": {"prometheus_url": prometheus}} if prometheus else {}),
    )
    return create_app(config, Ledger(db)).test_client()


def ledger_of(client: FlaskClient) -> Ledger:
    found: Ledger = client.application.extensions["slurmedic"]["ledger"]
    return found


@pytest.fixture
def client(tmp_path: Path, users_file: Path) -> FlaskClient:
    return console(tmp_path, users_file)


def test_an_approver_asks_for_a_drill_as_the_cli_does(client: FlaskClient) -> None:
    csrf = login(client, "anna")
    page = client.get("/console/drills").get_data(as_text=True)
    assert 'action="/console/drills/ask"' in page and "no drills yet" in page
    # No Prometheus: the drill can only be now, and the page says why.
    assert 'value="before_checkpoint"' not in page and "only now" in page
    r = client.post(ASK, data={"csrf_token": csrf, "job": "42", "exclude": "gpu02", "when": "now"})
    assert r.status_code == 302 and r.headers["Location"].endswith("/console/drills")
    (asked,) = ledger_of(client).drills.latest()
    assert (asked.job, asked.by, asked.exclude, asked.state) == (42, "anna", "gpu02", "asked")
    assert asked.not_before == asked.asked_at  # now
    # The loop takes it as it takes the CLI's.
    (due,) = ledger_of(client).drills.due(asked.asked_at)
    assert (due.id, due.job, due.by, due.exclude) == (asked.id, 42, "anna", "gpu02")
    page = client.get("/console/drills").get_data(as_text=True)
    assert f"drill {asked.id} of job 42 asked for now: the leader&#39;s loop plans it" in page
    assert '<span class="chip asked">asked</span>' in page and "not planned yet" in page


def test_a_viewer_sees_the_drills_but_cannot_ask(client: FlaskClient) -> None:
    ledger_of(client).drills.ask(7, "ops", datetime.now(UTC), datetime.now(UTC), None)
    csrf = login(client, "vera")
    page = client.get("/console/drills").get_data(as_text=True)
    assert 'action="/console/drills/ask"' not in page and "An approver can ask" in page
    assert "<td>ops</td>" in page
    assert client.post(ASK, data={"csrf_token": csrf, "job": "8"}).status_code == 403
    assert [d.job for d in ledger_of(client).drills.latest()] == [7]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"job": "0"}, "job: &#39;0&#39; is not a job id"),
        ({"job": "-3"}, "job: &#39;-3&#39; is not a job id"),
        ({"job": "12a"}, "job: &#39;12a&#39; is not a job id"),
        ({"job": "\u00b2"}, "is not a job id"),
        ({"job": "99999999999"}, "is not a job id"),
        ({"job": ""}, "job: &#39;&#39; is not a job id"),
        ({"job": "42", "exclude": "gpu01;reboot"}, "exclude: &#39;gpu01;reboot&#39; is not a node"),
        ({"job": "42", "exclude": "-gpu01"}, "is not a node name"),
        (
            {"job": "42", "when": "later"},
            "when: &#39;later&#39; is not one of now, before_checkpoint",
        ),
        # Without a Prometheus the checkpoint cannot be timed: said, not guessed.
        ({"job": "42", "when": "before_checkpoint"}, "needs verification.prometheus_url"),
    ],
)
def test_a_bad_field_is_a_400_with_its_reason(
    client: FlaskClient, fields: dict[str, str], reason: str
) -> None:
    csrf = login(client, "anna")
    r = client.post(ASK, data={"csrf_token": csrf, **fields})
    assert r.status_code == 400 and reason in r.get_data(as_text=True)
    assert ledger_of(client).drills.latest() == []


def test_asking_without_the_csrf_token_is_refused(client: FlaskClient) -> None:
    login(client, "anna")
    r = client.post(ASK, data={"job": "42"})
    assert r.status_code == 400 and "CSRF" in r.get_data(as_text=True)
    assert ledger_of(client).drills.latest() == []


def checkpoints(times: list[float]) -> dict[str, Any]:
    series = [
        {"metric": {"slurm_job_id": "42", "rank": "0"}, "values": [[t, str(t)] for t in times]}
    ]
    return {"status": "success", "data": {"resultType": "matrix", "result": series}}


def test_a_drill_timed_before_the_jobs_next_checkpoint(
    tmp_path: Path, users_file: Path, prom: Scripted
) -> None:
    client = console(tmp_path, users_file, f"http://127.0.0.1:{prom.server_address[1]}")
    csrf = login(client, "anna")
    assert 'value="before_checkpoint"' in client.get("/console/drills").get_data(as_text=True)
    last = float(int(datetime.now(UTC).timestamp()))
    prom.script = [(200, checkpoints([last - 1200, last - 600, last]))]  # every 10 minutes
    r = client.post(ASK, data={"csrf_token": csrf, "job": "42", "when": "before_checkpoint"})
    assert r.status_code == 302, r.get_data(as_text=True)
    (asked,) = ledger_of(client).drills.latest()
    due = datetime.fromtimestamp(last + 600, tz=UTC) - timedelta(seconds=30)
    assert asked.not_before == due and asked.not_before > asked.asked_at
    path, query = prom.requests[-1]
    assert path == "/api/v1/query" and 'slurm_job_id="42"' in query["query"][0]
    # A job that reported one checkpoint has no interval: refused, nothing asked.
    prom.script = [(200, checkpoints([last]))]
    r = client.post(ASK, data={"csrf_token": csrf, "job": "43", "when": "before_checkpoint"})
    assert r.status_code == 409 and "has not reported two checkpoints" in r.get_data(as_text=True)
    # Prometheus answering with an error: the reason, nothing asked.
    prom.script = [(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})]
    r = client.post(ASK, data={"csrf_token": csrf, "job": "44", "when": "before_checkpoint"})
    assert r.status_code == 503 and "could not be read" in r.get_data(as_text=True)
    assert [d.job for d in ledger_of(client).drills.latest()] == [42]


T = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def drilled(ledger: Ledger, job: int, at: datetime, verdict_: Verdict | None) -> str:
    """A drill asked, planned by the core on a view of its running job, and judged."""
    ledger.drills.ask(job, "anna", at, at, None)
    (request,) = ledger.drills.due(at)
    v = ClusterView()
    v.set_job(Job(id=job, nodes=("gpu01",), partition="train", started=at - timedelta(hours=1)))
    decision = drills.plan(request, v, load_policy({}), at)
    ledger.plan_drill(request, decision, "planned")
    point = FailurePoint(step=120.0, checkpoint_step=100.0, work_lost_seconds=60.0, quality=2.1)
    watch = Watch(decision.incident, job, 0, drills.CAUSE, at, at, point, drill=True)
    ledger.watch(watch)
    if verdict_ is not None:
        ledger.conclude(decision.incident, drills.judge(verdict_), at + timedelta(minutes=5))
    return decision.incident


def test_the_drills_page_shows_each_outcome_with_its_evidence(client: FlaskClient) -> None:
    ledger = ledger_of(client)
    resume = Resume(
        step=100.0,
        expected=100.0,
        lost_steps=20.0,
        lost_seconds=60.0,
        start_seconds=45.0,
        quality_before=2.1,
        quality_after=2.05,
    )
    drilled(ledger, 42, T, Verdict("recovered", "step 130 passed 120", resume=resume))
    old = replace(resume, step=40.0, lost_steps=80.0, lost_seconds=240.0)
    drilled(ledger, 43, T, Verdict("recovered", "step 125 passed 120", resume=old))
    ledger.drills.ask(44, "anna", T, T, None)
    (refused,) = ledger.drills.due(T + timedelta(seconds=1))
    ledger.plan_drill(refused, None, "job 44 was submitted with --no-requeue")
    login(client, "vera")
    page = client.get("/console/drills").get_data(as_text=True)
    rows = page.split("<tbody>", 1)[1].split("<tr>")[1:]
    passed = next(r for r in rows if 'href="/console/incident/drill:42.0"' in r)
    assert '<span class="chip passed">passed</span>' in passed
    assert "<td>100 / 100</td>" in passed and "<td>20, 60 s</td>" in passed
    assert "<td>45 s</td>" in passed and "<td>2.1 → 2.05</td>" in passed
    failed = next(r for r in rows if 'href="/console/incident/drill:43.0"' in r)
    assert '<span class="chip failed">failed</span>' in failed
    assert "not from its last checkpoint" in failed and "<td>40 / 100</td>" in failed
    no = next(r for r in rows if "<td>44</td>" in r)
    assert '<span class="chip refused">refused</span>' in no and "--no-requeue" in no
    # The navigation leads there.
    assert 'href="/console/drills">drills</a>' in client.get("/console/").get_data(as_text=True)


def test_the_trial_report_lists_drills_apart_from_the_recommendations(
    client: FlaskClient, tmp_path: Path
) -> None:
    ledger = ledger_of(client)
    resume = Resume(step=100.0, expected=100.0, lost_steps=20.0, lost_seconds=60.0)
    ok = drilled(
        ledger,
        42,
        T,
        Verdict("recovered", "step 130 passed 120", resume=replace(resume, start_seconds=45.0)),
    )
    bad = drilled(ledger, 43, T, Verdict("failed", "quality 9.8 | not 2.1", resume=resume))
    # Someone recorded a verdict on a drill's requeue: it is no recommendation all the same.
    drill_decision = next(d for d in ledger.rows(list(range(1, 10))) if d.incident == ok)
    review.add_verdict(ledger, drill_decision.id, verdict(verdict="agree", by="anna"), T)
    login(client, "vera")
    page = client.get("/console/report?days=3650").get_data(as_text=True)
    assert "0 recommendations, 0 judged" in page
    table = page.split('id="report-drills"', 1)[1].split("</table>", 1)[0]
    assert "<td>42</td>" in table and '<span class="chip passed">passed</span>' in table
    assert "<td>20 steps, 60s</td>" in table and "<td>45s</td>" in table
    assert '<span class="chip failed">failed</span> quality 9.8 | not 2.1' in table
    assert bad == "drill:43.0"

    config = tmp_path / "cli.yml"
    config.write_text(yaml.safe_dump({"database_url": ledger.url}))

    def report(fmt: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "trial", "report", "--since=3650d",
             f"--format={fmt}", f"--config={config}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout

    body = json.loads(report("json"))
    assert body["recommendations"] == 0 and body["groups"] == []
    assert [(d["job"], d["outcome"], d["passed"]) for d in body["drills"]] == [
        (42, "passed", True),
        (43, "failed", False),
    ]
    groups_md, table_md = check(report("md"))
    assert len(groups_md) == 1  # its header alone: no recommendation
    assert table_md[0] == list(DRILL_TABLE)
    assert table_md[2][1] == "43" and table_md[2][-1] == "failed: quality 9.8 | not 2.1"
    groups, drill_csv = report("csv").split("\n\n")
    assert len(list(csv.reader(io.StringIO(groups)))) == 1  # the header: no recommendation
    found = list(csv.DictReader(io.StringIO(drill_csv)))
    assert [(r["job"], r["outcome"], r["lost_steps"], r["start_seconds"]) for r in found] == [
        ("42", "passed", "20", "45"),
        ("43", "failed", "20", ""),
    ]
