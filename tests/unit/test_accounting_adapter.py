"""The accounting adapter on what each Slurm release really prints (tests/data/accounting: a
lab run per stack, made by capture.py there): every run of every job, and who took which node
out of service, read the same from 22.05, 24.11 and 26.05."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from webhook.adapters.accounting import AccountingError, read_attempts, read_events

DATA = Path(__file__).parents[1] / "data" / "accounting"
STACKS = ("bookworm", "trixie", "sid")
# The format capture.py asked sacctmgr for (events.txt).
SAMPLE_FIELDS = (
    "Cluster",
    "ClusterNodes",
    "NodeName",
    "TimeStart",
    "TimeEnd",
    "Duration",
    "State",
    "StateRaw",
    "Event",
    "EventRaw",
    "Reason",
    "User",
    "TRES",
)


def made(stack: str) -> dict:
    return json.loads((DATA / stack / "made.json").read_text())


@pytest.mark.parametrize("stack", STACKS)
def test_every_run_of_every_job(stack: str) -> None:
    m = made(stack)
    attempts = read_attempts(json.loads((DATA / stack / "sacct.json").read_text()))
    runs = {(a.job, a.attempt): a for a in attempts}
    assert runs[(m["completed"], 0)].state == "COMPLETED"
    assert runs[(m["failed"], 0)].state == "FAILED"
    assert runs[(m["node_fail"], 0)].state == "NODE_FAIL"
    assert m["dead_node"] in runs[(m["node_fail"], 0)].nodes
    # The requeued job: its first run ended REQUEUED, the second completed, after it.
    first, second = runs[(m["requeued"], 0)], runs[(m["requeued"], 1)]
    assert first.state == "REQUEUED" and second.state == "COMPLETED"
    assert first.ended is not None and second.started is not None
    assert first.ended <= second.started
    assert first.nodes and first.gpus == 8 * len(first.nodes)
    assert all(a.started and a.ended and a.submitted for a in attempts)


@pytest.mark.parametrize("stack", STACKS)
def test_who_took_which_node_out_of_service(stack: str) -> None:
    m = made(stack)
    events = read_events((DATA / stack / "events.txt").read_text(), SAMPLE_FIELDS)
    by_node = {e.node: e for e in events}
    assert "" not in by_node  # the cluster's own event is not a node's
    drain = by_node[m["drained_by_person"]]
    assert (drain.user, drain.reason, drain.by) == (m["person"], m["drain_reason"], "person")
    assert drain.drained and drain.end is not None and drain.start < drain.end
    down = by_node[m["dead_node"]]
    assert down.state.startswith("DOWN") and down.by == "slurm" and not down.drained


def test_a_reason_that_holds_the_separator_is_kept_whole() -> None:
    line = "gpu01|2026-12-01T10:00:00|Unknown|DRAIN|ops(1001)|bad|HBM\n"
    (e,) = read_events(line)
    assert (e.reason, e.user, e.end) == ("bad|HBM", "ops", None)


@pytest.mark.parametrize(
    ("text", "says"),
    [("gpu01|2026-12-01T10:00:00\n", "line 1"), ("gpu01|yesterday|Unknown|DRAIN|ops|x\n", "start")],
)
def test_output_it_cannot_read_is_one_error_naming_the_line(text: str, says: str) -> None:
    with pytest.raises(AccountingError, match=says):
        read_events(text)


def test_sacct_output_without_jobs_is_one_error() -> None:
    with pytest.raises(AccountingError, match="no 'jobs' list"):
        read_attempts({"errors": []})
