"""64-character node names (issue 36) through the real playbooks and the real ledger: drain_nodes
in check mode and collect_diagnostics, through slurmedic's runner (ansible-runner, on localhost,
a stand-in `scontrol` as in test_playbook_results.py), take the longest keys and reasons their
own "Check the request" tasks meet; called without slurmedic's validation, those tasks still
refuse a 65-character name, a key one character too long and a reason one too long. The ledger
keeps such keys on both backends (PostgreSQL refused a key of more than 64 before 0009)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tests.service.conftest import stand_in
from tests.service.test_playbook_checks import run as run_unchecked
from tests.service.test_playbook_results import SCONTROL
from webhook.core.decisions import Decision
from webhook.core.engine import Incident
from webhook.core.incidents import IncidentKey, drain_reason
from webhook.executor.diagnostics import keep
from webhook.executor.dispatch import playbook_for
from webhook.executor.runner import run_playbook
from webhook.ledger.schema import DecisionRow
from webhook.ledger.store import Ledger

N64 = "a3-megagpu-8g-pretrain-pool-0001.us-central1-a.c.ml-prd.internal"
N65 = N64.replace("ml-prd", "ml-prod")
LONGEST_KEY = str(IncidentKey.repairing(N64, 999_999))  # 78 characters
NOTE = "repeat 12 in 7d - hardware suspect RMA"  # words a reason may add: within the 40 kept
T = datetime(2026, 12, 12, 9, 0, tzinfo=UTC)


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "calls.log"
    stand_in(tmp_path, monkeypatch, "scontrol", SCONTROL.format(log=log))
    return log


def drain_vars(incident: str) -> dict[str, Any]:
    """The drain's extra vars as the executor builds them from a recorded decision."""
    row = DecisionRow(
        incident=incident, job=None, action="drain", cause="gpu_hardware", nodes=[N64], exclude=[]
    )
    target = playbook_for(row)
    assert target is not None and target[0] == "drain_nodes"
    return target[1]


@pytest.mark.parametrize(
    ("extravars", "reason"),
    [
        (drain_vars(f"node:{N64}:12"), f"slurmedic: node:{N64}:12 gpu_hardware"),
        # The longest key, the longest cause, and a note as long as the room kept for one.
        (
            {
                "slurmedic_nodes": [N64],
                "slurmedic_reason": drain_reason(LONGEST_KEY, "shared_infrastructure", NOTE),
            },
            f"slurmedic: {LONGEST_KEY} shared_infrastructure {NOTE}",
        ),
    ],
    ids=["node-key", "longest-reason"],
)
def test_drain_nodes_takes_a_64_character_name_and_its_longest_reason(
    extravars: dict[str, Any], reason: str, scontrol: Path
) -> None:
    assert extravars["slurmedic_reason"] == reason
    result = run_playbook("drain_nodes", extravars, check=True)
    assert result.ok, result.output[-2000:]
    assert result.commands == [f'scontrol update nodename={N64} state=drain reason="{reason}"']
    assert result.before == {N64: "ALLOCATED"}
    # Check mode: Slurm was only read.
    assert scontrol.read_text().splitlines() == [f"show node {N64} --oneliner"]


def test_collect_diagnostics_takes_a_64_character_name_and_keeps_its_artifacts(
    tmp_path: Path,
) -> None:
    slurmd_log = tmp_path / "slurmd.log"
    slurmd_log.write_text("line 1\nline 2\n")
    node = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "slurmedic_nvidia_smi": ["echo", "<nvidia_smi_log/>"],
        "slurmedic_slurmd_log": str(slurmd_log),
    }
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local"}
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "slurm_controller": {"hosts": {"localhost": local}},
                        "slurm_nodes": {"hosts": {N64: node}},
                    }
                }
            }
        )
    )
    extravars = {"slurmedic_nodes": [N64], "slurmedic_incident": LONGEST_KEY}
    result = run_playbook("collect_diagnostics", extravars, check=True, inventory=inventory)
    assert result.ok, result.output[-2000:]
    assert list(result.diagnostics) == [N64]
    assert result.diagnostics[N64]["slurmd_log"]["stdout"] == "line 1\nline 2"
    note = keep(result, tmp_path / "artifacts", LONGEST_KEY)
    folder = Path(note["nodes"][N64]["artifacts"])
    assert folder == tmp_path / "artifacts" / LONGEST_KEY.replace(":", "_") / N64
    assert (folder / "slurmd.log").read_text() == "line 1\nline 2"


def test_slurmedic_refuses_a_65_character_name_before_any_playbook() -> None:
    with pytest.raises(ValidationError):
        run_playbook("drain_nodes", {**drain_vars("7.0"), "slurmedic_nodes": [N65]}, check=True)
    with pytest.raises(ValidationError):
        run_playbook(
            "collect_diagnostics",
            {"slurmedic_nodes": [N65], "slurmedic_incident": "7.0"},
            check=True,
        )


@pytest.mark.parametrize(
    ("playbook", "evars", "failed"),
    [
        # Accepted by the checks: the run goes on to the first command (no Slurm here).
        ("drain_nodes", drain_vars(LONGEST_KEY), "Read the nodes' state"),
        # One character past a bound: refused by the playbook's own check.
        (
            "drain_nodes",
            {"slurmedic_nodes": [N65], "slurmedic_reason": "slurmedic: 7.0 gpu_hardware"},
            "Check the request's values",
        ),
        (
            "drain_nodes",
            {"slurmedic_nodes": [N64], "slurmedic_reason": "slurmedic: " + "a" * 161},
            "Check the request's values",
        ),
        (
            "collect_diagnostics",
            {"slurmedic_nodes": [N65], "slurmedic_incident": "7.0"},
            "Check the node names and the incident",
        ),
        (
            "collect_diagnostics",
            {"slurmedic_nodes": [N64], "slurmedic_incident": f"{LONGEST_KEY}9"},
            "Check the node names and the incident",
        ),
        (
            "resume_nodes",
            {"slurmedic_nodes": [N65]},
            "Check the request's values",
        ),
        (
            "requeue_job",
            {"slurmedic_job": 7, "slurmedic_attempt": 0, "slurmedic_exclude": [N65]},
            "Check the request's values",
        ),
    ],
    ids=["drain-64", "drain-65", "reason-172", "diag-65", "key-79", "resume-65", "requeue-65"],
)
def test_the_playbooks_own_checks_draw_the_line_at_the_bounds(
    tmp_path: Path, playbook: str, evars: dict[str, Any], failed: str
) -> None:
    """ansible-playbook without slurmedic's validation (strings !unsafe, as slurmedic passes
    them): the first task that fails is the one named."""
    rc, failures, output = run_unchecked(tmp_path, playbook, evars)
    assert rc != 0 and failures == [failed], output[-3000:]


def test_the_ledger_keeps_the_longest_keys(ledger: Ledger) -> None:
    """On SQLite and PostgreSQL (whose varchar(64) refused them before revision 0009)."""
    resume = str(IncidentKey.resuming(tuple(f"{N64[:-4]}{i:04d}" for i in range(0, 400, 3))))
    assert len(resume) > 76 and resume.startswith("resume:")
    decisions = [
        Decision(
            at=T,
            incident=LONGEST_KEY,
            job=None,
            action="drain",
            cause="gpu_hardware",
            reason="XID 79",
            nodes=(N64,),
        ),
        Decision(
            at=T,
            incident=resume,
            job=None,
            action="resume",
            cause="unknown",
            reason="returned to service",
            nodes=(N64,),
            mode="enforce",
        ),
    ]
    incident = Incident(key=LONGEST_KEY, job=None, node=N64, opened_at=T)
    ids = ledger.record(decisions, [incident])
    assert [ledger.incident_decisions(k)[0].id for k in (LONGEST_KEY, resume)] == ids
    restored = ledger.restore_incidents(since=T.replace(hour=8))
    assert LONGEST_KEY in [i.key for i in restored]
    assert IncidentKey.parse(LONGEST_KEY).node == N64
