"""The review console through Flask's test client on a real SQLite ledger: login and roles,
CSRF on every form, filters refused with a reason, an incident's dry-run commands, approvals
in order and verdicts recorded. The lab's browser test (tests/lab/test_console_browser.py)
drives the same pages in chromium against a real slurmedic."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from flask.testing import FlaskClient

from tests.service.conftest import console_config
from webhook.app import create_app
from webhook.core.decisions import Decision
from webhook.core.recovery import FailurePoint, Verdict, Watch
from webhook.core.verdicts import verdict
from webhook.ledger import review
from webhook.ledger.store import Ledger

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DRAIN = 'scontrol update nodename=gpu01 state=drain reason="slurmedic: 7.0 gpu_hardware"'
EVIDENCE = (
    {
        "alertname": "GpuXidNodeFault",
        "node": "gpu01",
        "startsAt": "2026-11-29T11:59:50Z",
        "fingerprint": "abc",
    },
)


def decision(action: str, **kw: object) -> Decision:
    fields: dict[str, object] = {
        "at": T,
        "incident": "7.0",
        "job": 7,
        "action": action,
        "cause": "gpu_hardware",
        "reason": "XID 79 on gpu01 GPU 3",
        "mode": "approve",
        "state": "awaiting_approval",
        "evidence": EVIDENCE,
        **kw,
    }
    return Decision(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Made once, with the real command (hashing is slow on purpose)."""
    return users(tmp_path_factory.mktemp("users") / "users.yml")


def users(path: Path) -> Path:
    for name, role in (("vera", "viewer"), ("anna", "approver"), ("adam", "admin")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "webhook.cli",
                "console",
                "user",
                str(path),
                name,
                f"--role={role}",
                f"--password=pw-{name}",
            ],
            check=True,
            capture_output=True,
        )
    return path


@pytest.fixture
def setup(tmp_path: Path, users_file: Path) -> tuple[FlaskClient, Ledger, list[int]]:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = console_config(tmp_path, db, users_file)
    ledger = Ledger(db)
    ids = ledger.record(
        [
            decision("drain", nodes=("gpu01",), partition="train"),
            decision(
                "requeue",
                exclude=("gpu01",),
                reason="requeue job 7 without gpu01",
                partition="train",
            ),
        ]
    )
    ledger.add_note(
        ids[0],
        {
            "by": "executor",
            "dry_run": {"playbook": "drain_nodes", "status": "successful", "commands": [DRAIN]},
        },
        T,
    )
    ledger.record(
        [
            decision(
                "stop", incident="8.0", job=8, cause="application", mode="monitor", state="recorded"
            )
        ]
    )
    return create_app(config, ledger).test_client(), ledger, ids


def token(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


def login(client: FlaskClient, name: str) -> str:
    page = client.get("/console/login").get_data(as_text=True)
    r = client.post(
        "/console/login",
        data={"user": name, "password": f"pw-{name}", "csrf_token": token(page)},
    )
    assert r.status_code == 302, r.get_data(as_text=True)
    return token(client.get("/console/").get_data(as_text=True))


def test_pages_need_a_login_and_a_right_password(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    client, _, _ = setup
    r = client.get("/console/incident/7.0")
    assert r.status_code == 302 and "/console/login" in r.headers["Location"]
    page = client.get("/console/login").get_data(as_text=True)
    bad = client.post(
        "/console/login", data={"user": "anna", "password": "nope", "csrf_token": token(page)}
    )
    assert bad.status_code == 401 and "wrong password" in bad.get_data(as_text=True)
    assert client.get("/console/").status_code == 302


def test_a_form_without_its_csrf_token_is_refused(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    client, ledger, ids = setup
    login(client, "anna")
    r = client.post(f"/console/decision/{ids[0]}/approve")
    assert r.status_code == 400 and "CSRF" in r.get_data(as_text=True)
    assert ledger.rows([ids[0]])[0].state == "awaiting_approval"


def listed(html: str) -> list[str]:
    """The incidents of the list (not of the approval queue above it)."""
    table = html.split('<table class="incidents">', 1)[1]
    return re.findall(r'<a href="/console/incident/([^"]+)">', table)


def test_the_list_the_queue_and_filters(setup: tuple[FlaskClient, Ledger, list[int]]) -> None:
    client, _, _ = setup
    login(client, "vera")
    page = client.get("/console/").get_data(as_text=True)
    queue = page.split('<table class="incidents">', 1)[0]
    assert "Waiting for approval" in queue and queue.count('href="/console/incident/7.0"') == 2
    assert listed(page) == ["8.0", "7.0"]  # newest first
    assert listed(client.get("/console/?cause=application").get_data(as_text=True)) == ["8.0"]
    assert listed(client.get("/console/?node=gpu01").get_data(as_text=True)) == ["7.0"]
    assert listed(client.get("/console/?state=recorded&mode=monitor").get_data(as_text=True)) == [
        "8.0"
    ]
    bad = client.get("/console/?cause=cosmic_rays")
    assert bad.status_code == 400
    assert "cause: &#39;cosmic_rays&#39; is not one of" in bad.get_data(as_text=True)
    assert client.get("/console/?node=gpu01;reboot").status_code == 400


def cells(html: str, key: str) -> dict[str, str]:
    """The incident's row of the list, as its cells by column."""
    table = html.split('<table class="incidents">', 1)[1]
    heads = re.findall(r"<th>([^<]*)</th>", table.split("</thead>", 1)[0])
    row = table.split(f'href="/console/incident/{key}"', 1)[1].split("</tr>", 1)[0]
    values = re.findall(r"<td[^>]*>(.*?)</td>", "<td>" + row, flags=re.S)
    found = [re.sub(r"<[^>]+>", "", v).strip() for v in values]
    return dict(zip(heads, found, strict=True))


def test_the_list_names_the_node_the_signal_and_whether_it_is_judged(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    client, ledger, ids = setup
    login(client, "vera")
    page = client.get("/console/").get_data(as_text=True)
    seven, eight = cells(page, "7.0"), cells(page, "8.0")
    assert (seven["node"], seven["signal"], seven["verdicts"]) == (
        "gpu01",
        "GpuXidNodeFault",
        "unjudged",
    )
    assert eight["node"] == "gpu01"  # the stop names no node: its alert's
    review.add_verdict(ledger, ids[0], verdict(verdict="agree", by="vera"), T)
    assert cells(client.get("/console/").get_data(as_text=True), "7.0")["verdicts"] == (
        "1 of 2 judged"
    )
    review.add_verdict(ledger, ids[1], verdict(verdict="agree", by="vera"), T)
    assert cells(client.get("/console/").get_data(as_text=True), "7.0")["verdicts"] == "judged"


def test_an_incident_shows_its_commands_and_a_viewer_cannot_approve(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    client, ledger, ids = setup
    csrf = login(client, "vera")
    page = client.get("/console/incident/7.0").get_data(as_text=True)
    assert "scontrol update nodename=gpu01 state=drain reason=&#34;slurmedic: 7.0" in page
    assert "no dry run recorded yet" in page  # the requeue's
    assert "approve all" not in page
    r = client.post(f"/console/decision/{ids[0]}/approve", data={"csrf_token": csrf})
    assert r.status_code == 403
    assert ledger.rows([ids[0]])[0].state == "awaiting_approval"


def test_an_incident_shows_what_it_disrupts_and_how_the_recovery_went(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    client, ledger, _ = setup
    ledger.record(
        [
            decision("drain", incident="9.0", job=9, nodes=("gpu05",), gpus=8),
            decision("requeue", incident="9.0", job=9, exclude=("gpu05",), gpus=16, gpu_hours=36.0),
        ]
    )
    login(client, "vera")
    page = client.get("/console/incident/9.0").get_data(as_text=True)
    assert "disrupts: 8 GPUs out of service until resumed" in page
    assert "disrupts: 16 GPUs, 36.0 GPU-hours of the attempt so far" in page
    assert "<dt>recovery</dt>" not in page  # no requeue has run yet
    fault = T - timedelta(minutes=5)
    ledger.watch(Watch("9.0", 9, 0, "gpu_hardware", fault, T, FailurePoint(120.0, 100.0, 60.0)))
    page = client.get("/console/incident/9.0").get_data(as_text=True)
    assert '<span class="chip watching">watching</span>' in page
    ledger.conclude(
        "9.0",
        Verdict("recovered", "step 130 passed 120", restored_seconds=420.0),
        T + timedelta(minutes=2),
    )
    page = client.get("/console/incident/9.0").get_data(as_text=True)
    assert '<span class="chip recovered">recovered</span>' in page
    assert "training resumed 420 s after the fault" in page and "60 s of work lost" in page
    assert "recovery recovered: step 130 passed 120" in page  # in the timeline


def test_approving_an_incident_approves_its_decisions_in_order(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    client, ledger, ids = setup
    csrf = login(client, "anna")
    assert client.post("/console/incident/7.0/reject", data={"csrf_token": csrf}).status_code == 400
    r = client.post("/console/incident/7.0/approve", data={"csrf_token": csrf})
    assert r.status_code == 302
    rows = {r.action: r for r in ledger.rows(ids)}
    assert {a: r.state for a, r in rows.items()} == {"drain": "approved", "requeue": "approved"}
    events = [ledger.decision(i)[1][-1] for i in ids]  # type: ignore[index]
    assert [e.detail["by"] for e in events] == ["anna", "anna"]
    assert events[0].id < events[1].id  # the drain first
    again = client.post("/console/incident/7.0/approve", data={"csrf_token": csrf})
    assert again.status_code == 409


def test_verdicts_are_appended_and_checked(setup: tuple[FlaskClient, Ledger, list[int]]) -> None:
    client, ledger, ids = setup
    csrf = login(client, "vera")
    url = f"/console/decision/{ids[1]}/verdict"
    missing = client.post(url, data={"csrf_token": csrf, "verdict": "disagree"})
    assert missing.status_code == 400 and "would" in missing.get_data(as_text=True)
    odd = client.post(url, data={"csrf_token": csrf, "verdict": "disagree", "would": "reflash"})
    assert odd.status_code == 400 and "would: Input should be" in odd.get_data(as_text=True)
    form = client.get("/console/incident/7.0").get_data(as_text=True)
    assert '<option value="requeue_anywhere">requeue_anywhere (requeue without' in form
    for fields in (
        {"verdict": "disagree", "would": "stop", "note": "no checkpoint yet"},
        {"verdict": "agree", "note": "on second thought"},
        {"verdict": "disagree", "would": "let_finish", "note": "it ends in an hour"},
    ):
        assert client.post(url, data={"csrf_token": csrf, **fields}).status_code == 302
    found = review.verdicts_of(ledger, [ids[1]])[ids[1]]
    assert [(v.by, v.verdict, v.would) for v in found] == [
        ("vera", "disagree", "stop"),
        ("vera", "agree", None),
        ("vera", "disagree", "let_finish"),
    ]
    page = client.get("/console/incident/7.0").get_data(as_text=True)
    assert "(would stop)" in page and "no checkpoint yet" in page
    assert "(would let_finish)" in page


def test_the_verdict_command(setup: tuple[FlaskClient, Ledger, list[int]], tmp_path: Path) -> None:
    _, ledger, ids = setup
    config = tmp_path / "cli.yml"
    config.write_text(yaml.safe_dump({"database_url": ledger.url}))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "webhook.cli", "verdict", *args, f"--config={config}"],
            capture_output=True,
            text=True,
            check=False,
        )

    ok = run(str(ids[0]), "agree", "--by=ops1", "--note=XID 79 is fatal")
    assert ok.returncode == 0, ok.stderr
    bad = run(str(ids[0]), "unsure", "--would=drain")
    assert bad.returncode == 1 and "would: only a disagreement" in bad.stderr
    odd = run(str(ids[0]), "disagree", "--would=reflash")
    assert odd.returncode == 2 and "'--would'" in odd.stderr and "drain_only" in odd.stderr
    alt = run(str(ids[0]), "disagree", "--would=drain_only", "--by=ops1")
    assert alt.returncode == 0 and "(would drain_only)" in alt.stdout
    gone = run("999", "agree")
    assert gone.returncode == 1 and "decision 999 is not in the ledger" in gone.stderr
    assert [v.by for v in review.verdicts_of(ledger, [ids[0]])[ids[0]]] == ["ops1", "ops1"]


def metric(client: FlaskClient, name: str) -> dict[str, float]:
    text = client.get("/metrics").get_data(as_text=True)
    return {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith(name)
    }


def test_metrics_count_what_waits_and_the_verdicts(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    client, _, ids = setup
    assert metric(client, "slurmedic_approvals_waiting") == {"slurmedic_approvals_waiting": 2.0}
    assert (
        metric(client, "slurmedic_approval_oldest_age_seconds")[
            "slurmedic_approval_oldest_age_seconds"
        ]
        > 0
    )
    csrf = login(client, "anna")
    for decision_id, form in (
        (ids[0], {"verdict": "agree"}),
        (ids[1], {"verdict": "agree"}),
        (ids[1], {"verdict": "disagree", "would": "stop"}),  # a change of mind: the latest counts
    ):
        client.post(f"/console/decision/{decision_id}/verdict", data={"csrf_token": csrf, **form})
    client.post("/console/incident/7.0/approve", data={"csrf_token": csrf})
    judged = {k: v for k, v in metric(client, "slurmedic_verdicts{").items() if v}
    assert judged == {
        'slurmedic_verdicts{action="drain",verdict="agree"}': 1.0,
        'slurmedic_verdicts{action="requeue",verdict="disagree"}': 1.0,
    }
    assert 'slurmedic_verdicts{action="stop",verdict="unsure"}' in metric(
        client, "slurmedic_verdicts{"
    )  # every series from the start, 0 until judged
    assert metric(client, "slurmedic_approvals_waiting") == {"slurmedic_approvals_waiting": 0.0}


def test_an_admin_flips_the_switch_and_resets_the_breaker(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    from webhook.ledger.settings import Breaker, Switch

    client, ledger, _ = setup
    ledger.put(Breaker(open=True, opened_at=T), T)
    csrf = login(client, "anna")
    assert (
        client.post("/console/switch", data={"csrf_token": csrf, "to": "monitor"}).status_code
        == 403
    )
    client.post("/console/logout", data={"csrf_token": csrf})
    csrf = login(client, "adam")
    page = client.get("/console/").get_data(as_text=True)
    assert "OPEN" in page and "reset the breaker" in page and "switch to monitor" in page
    assert client.post("/console/switch", data={"csrf_token": csrf, "to": "off"}).status_code == 400
    assert (
        client.post("/console/switch", data={"csrf_token": csrf, "to": "monitor"}).status_code
        == 302
    )
    assert ledger.setting(Switch).monitor is True
    assert client.post("/console/breaker/reset", data={"csrf_token": csrf}).status_code == 302
    breaker = ledger.setting(Breaker)
    assert breaker.open is False and breaker.reset_at is not None
    page = client.get("/console/").get_data(as_text=True)
    assert "monitor: every action a dry run" in page and "follow the policy" in page


def test_the_partition_filter(setup: tuple[FlaskClient, Ledger, list[int]]) -> None:
    client, _, _ = setup
    login(client, "vera")
    assert listed(client.get("/console/?partition=train").get_data(as_text=True)) == ["7.0"]
    assert listed(client.get("/console/?partition=debug").get_data(as_text=True)) == []
    assert client.get("/console/?partition=a%20b").status_code == 400


def test_the_trial_report_from_the_cli_and_the_console(
    setup: tuple[FlaskClient, Ledger, list[int]], tmp_path: Path
) -> None:
    client, ledger, ids = setup
    review.add_verdict(ledger, ids[0], verdict(verdict="agree", by="anna"), T)
    review.add_verdict(
        ledger, ids[1], verdict(verdict="disagree", would="stop", by="anna", note="no ckpt"), T
    )
    (nothing,) = ledger.record(
        [decision("none", incident="9.0", job=9, mode="monitor", state="recorded")]
    )
    review.add_verdict(ledger, nothing, verdict(verdict="disagree", would="drain", by="anna"), T)
    config = tmp_path / "cli.yml"
    config.write_text(yaml.safe_dump({"database_url": ledger.url}))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "webhook.cli", "trial", "report", *args, f"--config={config}"],
            capture_output=True,
            text=True,
            check=False,
        )

    since = (T - timedelta(hours=1)).isoformat()
    out = run(f"--since={since}", "--format=json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["recommendations"] == 4 and body["judged"] == 3
    groups = {(g["cause"], g["action"]): g for g in body["groups"]}
    assert groups[("gpu_hardware", "requeue")]["disagreements"][0]["would"] == "stop"
    assert groups[("gpu_hardware", "requeue")]["disagreements"][0]["harmful"] is False
    assert groups[("gpu_hardware", "none")]["missed"] == 1  # it should have drained
    md = run(f"--since={since}", "--format=md", "--min-agreed=1")
    # One agreed drain is enough agreement here, but not a varied record: not ready.
    assert (
        "- drain for gpu_hardware on partition train: 1 agreed of 1 judged, 0 harmful "
        "disagreement(s); agreed on 1 day(s), 1 node(s), 1 kind(s) of alert: not varied enough"
        in md.stdout
    )
    bad = run("--since=last tuesday")
    assert bad.returncode == 2 and "--since" in bad.stderr and "neither a duration" in bad.stderr

    login(client, "vera")
    page = client.get("/console/report?days=3650").get_data(as_text=True)
    assert "drain for gpu_hardware on partition train: 1 agreed of 1 judged" in page
    assert "anna would stop" in page and "no ckpt" in page
    assert "slurmedic did nothing for gpu_hardware, anna would drain" in page
    assert '<strong class="warn">(missed)</strong>' in page
    assert client.get("/console/report?days=0").status_code == 400
    # A digit that is not ASCII is a bad number, not a crash.
    assert client.get("/console/report?days=%C2%B2").status_code == 400


def test_a_kept_backtest_is_listed_and_shown_in_full(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    from tests.unit.test_backtest import T0, hour
    from webhook.backtest.report import as_json
    from webhook.backtest.run import run

    client, ledger, _ = setup
    login(client, "vera")
    assert "no backtest kept yet" in client.get("/console/backtests").get_data(as_text=True)
    report, _ = run(
        hour(),
        start=T0,
        until=T0 + timedelta(hours=4),
        policy=None,
        delay=timedelta(0),
        window=timedelta(hours=24),
    )
    report.limits = ["alert annotations are not kept by Prometheus"]
    kept = ledger.save_backtest(
        as_json(report), at=T, by="ops", span=(T0, T0 + timedelta(hours=4)), policy="defaults"
    )
    listing = client.get("/console/backtests").get_data(as_text=True)
    assert f'href="/console/backtest/{kept}"' in listing and "ops" in listing
    page = client.get(f"/console/backtest/{kept}")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    # The fault beside what people did: the drain 40 minutes later with its reason, the
    # resubmission, and the drain no alert explains.
    assert "101.0" in html and "bad HBM" in html and "resubmitted" in html
    assert "cable check" in html and "alert annotations are not kept" in html
    assert client.get("/console/backtest/999").status_code == 404


def test_alerts_naming_no_node_are_shown_and_counted(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    client, ledger, _ = setup
    assert metric(client, "slurmedic_alerts_unmatched_total") == {
        "slurmedic_alerts_unmatched_total": 0.0
    }
    login(client, "vera")
    page = client.get("/console/").get_data(as_text=True)
    assert "no node of the cluster" not in page
    from webhook.core.node_names import Unmatched as Seen
    from webhook.ledger.settings import Unmatched

    fqdn = "gpu01.cluster.example.org"

    seen = Seen(
        fqdn, "GpuXidNodeFault", "its short name gpu01 is a node: set node_names.strip_domain", T, T
    )
    seen.alerts = 4
    ledger.put(Unmatched().add([seen]), T)
    assert metric(client, "slurmedic_alerts_unmatched_total") == {
        "slurmedic_alerts_unmatched_total": 4.0
    }
    assert metric(client, "slurmedic_unmatched_hosts") == {"slurmedic_unmatched_hosts": 1.0}
    page = client.get("/console/").get_data(as_text=True)
    assert "4 alerts named a host that is no node of the cluster" in page
    assert f"<code>{fqdn}</code>: 4 (GpuXidNodeFault)" in page
    assert "set node_names.strip_domain" in page


def test_an_incident_shows_what_the_diagnostics_found_on_each_gpu(
    setup: tuple[FlaskClient, Ledger, list[int]],
) -> None:
    client, ledger, ids = setup
    problems = [
        "nvidia-smi shows 7 of 8 GPUs",
        "GPU 3 (00000000:48:00.0): missing from nvidia-smi's listing",
        "GPU 4 (00000000:58:00.0): NVLink errors: link 7 CRC Errors 37.",
    ]
    node = {"verdict": "unhealthy", "artifacts": "/var/x/7.0/gpu01", "problems": problems}
    diagnostics = {"playbook": "collect_diagnostics", "nodes": {"gpu01": node}}
    ledger.add_note(ids[0], {"by": "executor", "diagnostics": diagnostics}, T)
    login(client, "vera")
    page = client.get("/console/incident/7.0").get_data(as_text=True)
    assert "gpu01: <strong>unhealthy</strong>" in page
    for p in problems:
        assert f"<li>{p.replace(chr(39), '&#39;')}</li>" in page
