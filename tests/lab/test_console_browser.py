"""The review console in a real browser (Debian's chromium, driven by Playwright) against the
lab's real slurmedic in approve mode: a GPU fault on a running job becomes an incident waiting
for approval; the approver logs in, finds it in the queue and by filter, reads the exact
scontrol commands of the dry runs before approving, records a verdict, approves the whole
incident, and Slurm drains the node and requeues the job; the trial report counts the verdict;
the nodes page shows the drained node, why it left service and its reboot waiting for approval.

Screenshots of each page go to the test's directory, and to $SLURMEDIC_SCREENSHOTS when set
(docs/console/ holds the ones the docs show).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from lab import api, manage, monitoring
from lab.config import LabConfig
from lab.slurm import slurm
from tests.lab.conftest import PLAYBOOK_RUN_S, eventually, running_nodes, serve_slurmedic
from tests.lab.test_remediation import decided, healthy_after, mapped, restore
from webhook.ledger import review
from webhook.ledger.store import Ledger, last_dry_run

pytestmark = [pytest.mark.lab, pytest.mark.one_stack]
__all__ = ["healthy_after"]  # the autouse fixture: each test leaves a healthy cluster
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def approve(lab_cfg: LabConfig, tmp_path: Path) -> Iterator[Ledger]:
    yield serve_slurmedic(lab_cfg, tmp_path, "approve", repairs={"enabled": True})
    restore(lab_cfg)


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM}: ./scripts/setup.sh installs Debian's chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        yield context.new_page()
        context.close()
        browser.close()


def shot(page: Page, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if target := os.environ.get("SLURMEDIC_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)


def test_an_approver_reviews_judges_and_approves_an_incident_in_the_browser(
    lab_cfg: LabConfig,
    approve: Ledger,
    submit: Callable[..., int],
    page: Page,
    tmp_path: Path,
) -> None:
    job = submit(nodes=3)
    nodes = running_nodes(lab_cfg, job)
    mapped(lab_cfg, job)
    bad = nodes[1]
    manage.inject_gpu(lab_cfg, "xid", bad, 2, xid=79)
    incident = f"{job}.0"
    rows = decided(lab_cfg, approve, incident, 2, {"awaiting_approval"})

    def previewed() -> bool:
        found = [approve.decision(r.id) for r in rows.values()]
        return all(f is not None and last_dry_run(f[1]) is not None for f in found)

    # Two check-mode runs, one after the other: the deadline only bounds a hang.
    eventually(previewed, timeout=PLAYBOOK_RUN_S, what="the dry runs of both decisions")
    # The approver hears of it through the site's Alertmanager, one notice per decision.
    notice = {"alertname": "SlurmedicAwaitingApproval", "incident": incident}
    posted = eventually(
        lambda: len(found := api.alerts(lab_cfg, **notice)) == 2 and found,
        what="the approval notices in Alertmanager",
    )
    assert {a["labels"]["action"] for a in posted} == {"drain", "requeue"}
    assert all(a["annotations"]["console"].startswith(lab_cfg.console_url) for a in posted)

    # Logging in: the console sends a stranger to its login page, and back after it.
    page.goto(lab_cfg.console_url)
    expect(page).to_have_url(re.compile(r"/console/login\?next="))
    shot(page, tmp_path, "login")
    page.get_by_label("user").fill("approver")
    page.get_by_label("password").fill("wrong")
    page.get_by_role("button", name="log in").click()
    expect(page.get_by_role("alert")).to_contain_text("wrong password")
    page.get_by_label("user").fill("approver")
    page.get_by_label("password").fill(monitoring.console_password(lab_cfg, "approver"))
    page.get_by_role("button", name="log in").click()

    # The queue shows what waits, with its age; the filters find the incident by cause and job.
    queue = page.locator("section.queue")
    expect(queue.get_by_role("link", name=incident).first).to_be_visible()
    page.locator("select[name=cause]").select_option("gpu_hardware")
    page.locator("input[name=job]").fill(str(job))
    page.get_by_role("button", name="filter").click()
    listed = page.locator("table.incidents")
    expect(listed.get_by_role("link", name=incident)).to_be_visible()
    expect(listed.locator("tbody tr")).to_have_count(1)
    shot(page, tmp_path, "incidents")
    page.locator("select[name=cause]").select_option("application")
    page.get_by_role("button", name="filter").click()
    expect(page.locator("table.incidents")).to_contain_text("no incident matches")
    page.locator("select[name=cause]").select_option("gpu_hardware")
    page.get_by_role("button", name="filter").click()

    # The incident: its reason, evidence, and the exact commands before approval.
    page.locator("table.incidents").get_by_role("link", name=incident).click()
    expect(page.get_by_role("heading", name=f"Incident {incident}")).to_be_visible()
    commands = page.locator("pre.commands")
    expect(commands.first).to_contain_text(
        f'scontrol update nodename={bad} state=drain reason="slurmedic: {incident} gpu_hardware"'
    )
    expect(commands.nth(1)).to_contain_text(f"scontrol requeuehold {job}")
    expect(commands.nth(1)).to_contain_text(f"ExcNodeList={bad}")
    expect(page.locator("table").last).to_contain_text("GpuXid")
    shot(page, tmp_path, "incident-waiting")
    # Nothing moved in Slurm while a human reads.
    assert "DRAIN" not in slurm(lab_cfg, "scontrol", "show", "node", bad, "-o")
    assert manage.show_job(lab_cfg, job)["Restarts"] == "0"

    # A verdict on the drain, then the whole incident approved: drain, then requeue.
    drain = page.locator(f"#decision-{rows['drain'].id}")
    drain.get_by_label("agree", exact=True).check()
    drain.locator("input[name=note]").fill("XID 79: the GPU fell off the bus")
    drain.get_by_role("button", name="record verdict").click()
    expect(page.get_by_role("status").first).to_contain_text("verdict on drain")
    page.get_by_role("button", name="approve all").click()
    expect(page.get_by_role("status").first).to_contain_text("approved")

    # Two playbook runs, the drain first: the deadlines only bound a hang.
    eventually(
        lambda: "DRAIN" in slurm(lab_cfg, "scontrol", "show", "node", bad, "-o"),
        timeout=PLAYBOOK_RUN_S,
        what="the approved drain carried out",
    )
    eventually(
        lambda: int(manage.show_job(lab_cfg, job)["Restarts"]) >= 1,
        timeout=PLAYBOOK_RUN_S,
        what="the approved requeue carried out",
    )
    decided(lab_cfg, approve, incident, 2, {"executed"})
    eventually(lambda: not api.alerts(lab_cfg, **notice), what="the approval notices resolved")
    page.reload()
    expect(page.locator(f"#decision-{rows['requeue'].id} .chip").first).to_have_text("executed")
    expect(page.locator("ol.timeline")).to_contain_text("approved")
    expect(page.locator("ol.timeline")).to_contain_text("execution")
    shot(page, tmp_path, "incident-executed")

    # The trial report counts the verdict: the drain agreed on partition train.
    page.get_by_role("link", name="trial report").click()
    expect(page.locator("ul.readiness")).to_contain_text(
        "drain for gpu_hardware on partition train: 1 agreed of 1 judged, 0 harmful disagreement(s)"
    )
    expect(page.locator("table.report")).to_contain_text("gpu_hardware")
    shot(page, tmp_path, "trial-report")

    # The nodes page: the drained node, why it left service (linked to the incident), and its
    # repair, a reboot for an XID 79, waiting for the approver like any action.
    def reboot_waits() -> bool:
        return any(
            r.node == bad
            and [(s.action, s.state) for s in r.steps] == [("reboot", "awaiting_approval")]
            for r, _ in approve.repairs.listed(datetime(2000, 1, 1, tzinfo=UTC))
        )

    eventually(reboot_waits, timeout=60, what=f"the reboot of {bad} awaiting approval")
    page.get_by_role("link", name="nodes").click()
    expect(page.get_by_role("heading", name="Nodes out of service")).to_be_visible()
    row = page.locator(f"#node-{bad}")
    expect(row).to_contain_text("gpu_hardware")
    expect(row.get_by_role("link", name=incident)).to_be_visible()
    expect(row).to_contain_text("reboot")
    history = page.locator(f"#node-{bad} + tr.history")
    expect(history).to_contain_text("XID 79")
    expect(history.locator("ul.steps")).to_contain_text("reboot")
    expect(history.locator("ul.steps .chip")).to_have_text("awaiting_approval")
    shot(page, tmp_path, "nodes")

    found = review.verdicts_of(approve, [rows["drain"].id])[rows["drain"].id]
    assert [(v.by, v.verdict) for v in found] == [("approver", "agree")]
    events = {
        r.action: [e for e in approve.decision(r.id)[1] if e.state == "approved"]  # type: ignore[index]
        for r in rows.values()
    }
    assert all(e[0].detail["by"] == "approver" for e in events.values())
