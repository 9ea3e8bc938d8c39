"""Slurm accounting in the lab (slurmdbd on MariaDB), on the lab's stack: every attempt of a
job in `sacct`, a person's drain and resume and a dead node in `sacctmgr show event`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime

import pytest

from lab import manage, person
from lab.config import LabConfig
from lab.slurm import LabError, node_states, slurm
from tests.lab.conftest import eventually, job_story, next_attempt, running_nodes

pytestmark = pytest.mark.lab


@pytest.fixture(autouse=True)
def accounting(lab_cfg: LabConfig) -> None:
    if not lab_cfg.accounting:
        pytest.skip("the lab runs without accounting (SLURMEDIC_LAB_ACCOUNTING=0)")


EVENT_FIELDS = ("NodeName", "TimeStart", "TimeEnd", "State", "Reason", "User")


def attempts(cfg: LabConfig, *jobs: int) -> dict[int, list[tuple[str, str]]]:
    """Each job's records in accounting, one per attempt (`-D`): (state, exit code)."""
    out = slurm(
        cfg, "sacct", "-D", "-a", "-X", "-n", "-P", "-j", ",".join(map(str, jobs)),
        "--format=JobIDRaw,State,ExitCode",
    )  # fmt: skip
    found: dict[int, list[tuple[str, str]]] = {}
    for line in out.splitlines():
        job, state, code = line.split("|")
        found.setdefault(int(job), []).append((state.split()[0], code))
    return found


def events(cfg: LabConfig, node: str, since: str) -> list[dict[str, str]]:
    """The node's events from `since` (local time, as sacctmgr prints it)."""
    out = slurm(
        cfg, "sacctmgr", "-P", "-n", "show", "event", f"nodes={node}", f"start={since}",
        f"format={','.join(EVENT_FIELDS)}",
    )  # fmt: skip
    return [dict(zip(EVENT_FIELDS, line.split("|"), strict=True)) for line in out.splitlines()]


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def event(
    cfg: LabConfig, node: str, since: str, match: Callable[[dict[str, str]], bool]
) -> Callable[[], dict[str, str] | None]:
    """A probe: the node's first event since `since` that `match` takes, or None."""

    def probe() -> dict[str, str] | None:
        found = [e for e in events(cfg, node, since) if match(e)]
        return found[0] if found else None

    return probe


def ended(probe: Callable[[], dict[str, str] | None]) -> Callable[[], dict[str, str] | None]:
    """The event `probe` finds, once it has an end."""

    def probe_ended() -> dict[str, str] | None:
        found = probe()
        return found if found is not None and found["TimeEnd"] != "Unknown" else None

    return probe_ended


def idle_node(cfg: LabConfig) -> str:
    return eventually(
        lambda: sorted(n for n, s in node_states(cfg).items() if s == "idle")[-1],
        what="an idle node",
    )


def test_every_attempt_is_in_sacct(lab_cfg: LabConfig, submit: Callable[..., int]) -> None:
    """A job that completes, one that fails with exit 1 and one requeued by `scontrol requeue`
    whose second attempt completes: sacct -D has one record per attempt, with its state and
    exit code; the JSON form too."""
    completes = submit(nodes=1, name="completes", steps=10)
    fails = submit(nodes=1, name="crashes", requeue=False)
    requeued = submit(nodes=2, name="requeued", steps=60)
    running_nodes(lab_cfg, fails)
    manage.inject_job(lab_cfg, "crash_cuda", fails, 0)  # the rank exits 1 with a traceback
    running_nodes(lab_cfg, requeued)
    slurm(lab_cfg, "scontrol", "requeue", str(requeued))
    next_attempt(lab_cfg, requeued, 1)
    want = {
        completes: [("COMPLETED", "0:0")],
        fails: [("FAILED", "1:0")],
        requeued: [("REQUEUED", "0:0"), ("COMPLETED", "0:0")],
    }
    try:
        eventually(
            lambda: attempts(lab_cfg, *want) == want, timeout=90, what="every attempt in sacct"
        )
    except AssertionError as e:
        raise AssertionError(f"{e}\n{job_story(lab_cfg, requeued)}") from None
    data = json.loads(slurm(lab_cfg, "sacct", "--json", "-D", "-a", "-j", str(requeued)))
    records = [j for j in data["jobs"] if j["job_id"] == requeued]
    assert len(records) == 2
    # 22.05 gives the state as a string, 24.11 and later as a list of flags.
    states = [j["state"]["current"] for j in sorted(records, key=lambda j: j["time"]["start"])]
    assert [s if isinstance(s, str) else s[-1] for s in states] == ["REQUEUED", "COMPLETED"]


def test_a_persons_drain_and_resume_are_events(lab_cfg: LabConfig) -> None:
    """Drained and resumed by `ops` (not root): one event with the reason, the person's name,
    and its start and end."""
    node = idle_node(lab_cfg)
    since = now()
    reason = f"xid 79 on GPU 3, by hand at {since}"
    drain = event(lab_cfg, node, since, lambda e: e["Reason"] == reason)
    manage.drain_as(lab_cfg, person.PERSON, node, reason)
    try:
        opened = eventually(drain, what=f"the drain of {node} in the events")
        assert opened["User"].split("(")[0] == person.PERSON
        assert opened["TimeEnd"] == "Unknown"
        assert opened["State"].startswith("DRAIN")
        sinfo = slurm(lab_cfg, "sinfo", "-h", "-R", "-n", node, "-o", "%U|%E")
        who, why = sinfo.strip().split("|", 1)  # `ops(1001)|...`
        assert (who.split("(")[0], why) == (person.PERSON, reason)
        manage.resume_as(lab_cfg, person.PERSON, node)
        closed = eventually(ended(drain), what=f"the drain of {node} ended in the events")
    finally:
        slurm(lab_cfg, "scontrol", "update", f"nodename={node}", "state=resume", check=False)
    start = datetime.fromisoformat(closed["TimeStart"])
    assert datetime.fromisoformat(since) <= start <= datetime.fromisoformat(closed["TimeEnd"])
    assert datetime.fromisoformat(closed["TimeEnd"]) <= datetime.now()


def test_a_person_without_rights_is_refused(lab_cfg: LabConfig) -> None:
    """The person's commands really run as the person: `nobody` (on the host and in every
    root, and no Slurm admin) may not drain, so a drain as `ops` is not root's."""
    node = idle_node(lab_cfg)
    with pytest.raises(LabError, match=r"Invalid user id|Access/permission denied"):
        manage.drain_as(lab_cfg, "nobody", node, "not mine to drain")
    assert node_states(lab_cfg)[node] == "idle"


def test_a_killed_node_is_a_down_event(lab_cfg: LabConfig, clean_faults: None) -> None:
    """A node that loses power: a DOWN event ("Not responding", by slurmctld's user), which
    ends when the node is back."""
    node = idle_node(lab_cfg)
    since = now()
    manage.kill_node(lab_cfg, node)

    down = event(lab_cfg, node, since, lambda e: e["State"].startswith("DOWN"))
    opened = eventually(down, timeout=60, what=f"a DOWN event for {node}")
    assert opened["Reason"] == "Not responding"
    assert opened["User"].split("(")[0] == "root"
    manage.clear(lab_cfg, node)
    eventually(lambda: node_states(lab_cfg)[node] == "idle", timeout=60, what=f"{node} back")
    closed = eventually(ended(down), what=f"the DOWN event of {node} ended")
    assert closed["TimeStart"] <= closed["TimeEnd"]
