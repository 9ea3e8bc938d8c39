"""The fault suite's long form, on the real lab: rounds of one GPU fault each (an XID 79 in a
checkpointed 3-node job), with a fault of slurmedic's own parts injected at a random point of
its handling. Three (or two) `slurmedic serve` replicas in enforce mode on one PostgreSQL, two
Alertmanagers clustered with each other, each delivering to all three (tests/lab/replicas.py,
the same harness as tests/lab/test_faults.py, its short form in CI).

Faults: kill -9 of the leader; SIGSTOP of the leader's whole process tree past its lease (then
SIGCONT), its playbook runs too, as a VM pause; PostgreSQL restarted (fast shutdown); PostgreSQL
unreachable for 30 s (SIGSTOP of the server); the leader's disk full (its TMPDIR, a tmpfs).
Points: the fault's alert in Alertmanager, the first decision recorded, a decision running (its
playbook in flight). Two more pause the leader's tree at the worst moment, found from its
playbook's own commands: after its requeue has read the job and before it acts, until the new
leader's successor runs; after its drain has read the node and before it acts, until the new
leader has drained it and a person has resumed it (`--fault`, repeated: only those faults).

Prints a row per round and the fault table: per fault, rounds, alerts fired and not in the
ledger (lost), alert events stored, Alertmanager sends to slurmedic given up (sent again
later), Slurm's requeues and drains (its own log: a double action shows here), rounds
that lost or doubled anything, and the seconds until one replica led again (median, max).

    .venv/bin/python -m bench.faults [--rounds 10] [--seed N] [--replicas 2|3] [--stack trixie]
        [--port-base 24000] [--fault NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import cast

from lab import api, manage, monitoring, postgres
from lab.config import LabConfig
from lab.slurm import slurm
from tests.lab.conftest import eventually, next_attempt, queue, scrape
from tests.lab.replicas import (
    LEASE,
    POINTS,
    Replicas,
    act_windows,
    all_stored,
    carried_out,
    leads_again,
    mended,
    paused_after,
    reached,
    replicas,
    sends_failed,
    slurm_actions,
    table_row,
)
from tests.lab.test_remediation import checkpointed_job, heal
from webhook.core.lifecycle import EXECUTABLE

OUTAGE = 30.0  # seconds PostgreSQL answers nothing


Repair = Callable[[], None]


def kill_leader(r: Replicas, leader: str, job: int, node: str) -> Repair:
    r.kill(leader)
    return lambda: r.start(leader)


def stop_leader(r: Replicas, leader: str, job: int, node: str) -> Repair:
    stopped = r.pause_tree(leader, True)
    try:
        r.leader(not_=leader, timeout=4 * LEASE + 30)
    finally:
        r.pause_tree(leader, False, stopped)
    return lambda: None


def restart_postgres(r: Replicas, leader: str, job: int, node: str) -> Repair:
    postgres.restart(r.cfg)
    return lambda: None


def postgres_unreachable(r: Replicas, leader: str, job: int, node: str) -> Repair:
    postgres.pause(r.cfg, True)
    try:
        time.sleep(OUTAGE)  # the outage's length is what is tested
    finally:
        postgres.pause(r.cfg, False)
    return lambda: None


def disk_full(r: Replicas, leader: str, job: int, node: str) -> Repair:
    r.disks[leader].fill()
    return r.disks[leader].free


def woken(r: Replicas, leader: str, stopped: list[int]) -> None:
    r.pause_tree(leader, False, stopped)
    eventually(lambda: not r.runs(leader), timeout=180, what=f"{leader}'s runs ended")


def paused_before_the_requeue(r: Replicas, leader: str, job: int, node: str) -> Repair:
    stopped = paused_after(r, leader, ["scontrol", "show", "job", str(job), "--oneliner"])
    try:
        assert slurm_actions(r.cfg, job, node)[0] == 0, "the pause fell after the requeue"
        TAKEOVER.append(leads_again(r, r.paused_at, not_=leader))
        eventually(
            carried_out(r.ledger, f"{job}.0", others=True), timeout=240, what="drain and requeue"
        )
        next_attempt(r.cfg, job, 1, timeout=120)  # the successor a stale requeue would kill
    finally:
        woken(r, leader, stopped)
    return lambda: None


def paused_before_the_drain(r: Replicas, leader: str, job: int, node: str) -> Repair:
    stopped = paused_after(r, leader, ["scontrol", "show", "node", node, "--oneliner"])
    try:
        assert slurm_actions(r.cfg, job, node)[1] == 0, "the pause fell after the drain"
        TAKEOVER.append(leads_again(r, r.paused_at, not_=leader))
        eventually(
            carried_out(r.ledger, f"{job}.0", others=True), timeout=240, what="drain and requeue"
        )
        mended(r.cfg, node)  # a person mends the node and resumes it
    finally:
        woken(r, leader, stopped)
    return lambda: None


FAULTS: dict[str, Callable[[Replicas, str, int, str], Repair]] = {
    "kill -9 of the leader": kill_leader,
    "SIGSTOP of the leader past its lease": stop_leader,
    "PostgreSQL restarted": restart_postgres,
    f"PostgreSQL unreachable {OUTAGE:.0f} s": postgres_unreachable,
    "the leader's disk full": disk_full,
    "leader paused between read and requeue": paused_before_the_requeue,
    "leader paused between read and drain": paused_before_the_drain,
}
# Faults that find their own moment: the point is theirs, and so is the takeover's time.
AT_READ = {"leader paused between read and requeue", "leader paused between read and drain"}
TAKEOVER: list[float] = []  # seconds from such a pause until another replica leads


# Faults that take the leader out of play: the time to a leader is the time until another one
# leads. The others (the database's) count until any replica leads.
REPLACE_LEADER = {"kill -9 of the leader", "SIGSTOP of the leader past its lease",
                  "the leader's disk full", *AT_READ}  # fmt: skip


def drained_in_view(r: Replicas) -> list[str]:
    """Nodes slurmedic's own cluster view still holds drained (its /metrics)."""
    port = next(iter(r.ports.values()))
    samples = scrape(f"{r.cfg.url(port)}/metrics").get("slurmedic_node_status", [])
    return [labels["node"] for labels, _ in samples if labels.get("status", "").startswith("drain")]


def one_round(r: Replicas, fault: str, point: str) -> dict[str, object]:
    cfg = r.cfg
    leader = r.leader()
    # The last round's decisions all carried out (a node that failed again once its job left,
    # drained as a repeat), its nodes back in service, in slurmedic's view too: a decision on
    # a view that still holds the fault's node drained would not drain it again.
    eventually(lambda: not r.ledger.in_state(*EXECUTABLE), timeout=120, what="nothing to run")
    heal(cfg)
    eventually(lambda: not drained_in_view(r), timeout=120, what="no drained node in the view")
    job, nodes = checkpointed_job(
        cfg,
        lambda **kw: manage.submit_training(
            cfg, step_time=0.2, ckpt_every=5, nccl_timeout=3.0, **kw
        ),
    )
    # The ledger and Alertmanager's logs run on across rounds: this round's share is counted.
    stored_before, failed_before = len(r.ledger.alerts_after(0)), sends_failed(cfg)
    manage.inject_gpu(cfg, "xid", nodes[1], 4, xid=79)
    row: dict[str, object] = {"fault": fault, "point": point}
    repair: Repair = lambda: None  # noqa: E731
    TAKEOVER.clear()
    try:
        if fault in AT_READ:
            row["point"] = point = "the plan's read"
        else:
            reached(r, job, point)
        started = time.monotonic()
        repair = FAULTS[fault](r, leader, job, nodes[1])
        # A leader taken out: from the fault's start until another leads (a takeover). The
        # database's faults: from their end until one leads again.
        out = fault in REPLACE_LEADER
        since = started if out else time.monotonic()
        # A pause at a read measured its own takeover: from the pause, not from the wait for it.
        back = (
            TAKEOVER.pop()
            if fault in AT_READ
            else leads_again(r, since, not_=leader if out else None)
        )
        led = r.leader()
        done = eventually(
            carried_out(r.ledger, f"{job}.0", others=True), timeout=240, what="drain and requeue"
        )
        eventually(
            lambda: (i := manage.show_job(cfg, job))["JobState"] == "RUNNING" and i,
            timeout=90,
            what="the next attempt running",
        )
        all_stored(r, job)
        row |= table_row(fault, r, job, nodes[1], back)
        # The replicas' own counters start again with a killed one: not summed over rounds.
        del row["new events acknowledged"], row["answers 5xx"]
        row["events stored"] = len(r.ledger.alerts_after(0)) - stored_before
        row["Alertmanager sends failed"] = sends_failed(cfg) - failed_before
        row["act windows ms"] = act_windows(r.ledger, done)
        row |= {
            "point": point,
            "leader after": led,
            "states": ",".join(sorted(f"{a}:{x.state}" for a, x in done.items())),
            "restarts": manage.show_job(cfg, job)["Restarts"],
        }
    except Exception as e:  # a round that fails is counted, and the next one runs
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        repair()
        slurm(cfg, "scancel", str(job), check=False)
        eventually(lambda: not queue(cfg), timeout=60, what="the job gone")
        # The fault's alerts resolved before its node is resumed: a node resumed while one
        # still fires is rightly drained again, into the next round.
        manage.clear(cfg)
        with contextlib.suppress(AssertionError):
            eventually(lambda: not api.alerts(cfg, signal="gpu_hw"), timeout=120, what="quiet")
        heal(cfg)
    row["ok"] = (
        "error" not in row
        and row.get("states") == "drain:executed,requeue:executed"
        and row.get("Slurm requeues") == 1
        and row.get("Slurm drains") == 1
        and row.get("restarts") == "1"
        and row.get("not in the ledger") == 0
    )
    return row


def table(rows: list[dict[str, object]]) -> None:
    by: dict[str, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        by[str(row["fault"])].append(row)
    head = (
        f"{'fault':40} {'rounds':>6} {'fired':>5} {'lost':>4} {'stored':>6} "
        f"{'AM gave up':>10} {'requeues':>8} {'drains':>6} {'not ok':>6} {'to a leader s':>16}"
    )
    print(head)
    print("-" * len(head))

    def total(rs: list[dict[str, object]], key: str) -> int:
        return int(sum(float(str(x.get(key, 0))) for x in rs))

    for fault, rs in by.items():
        backs = [float(str(x["seconds to a leader"])) for x in rs if "seconds to a leader" in x]
        lead = f"{statistics.median(backs):.1f} / {max(backs):.1f}" if backs else "-"
        print(
            f"{fault:40} {len(rs):>6} {total(rs, 'alerts fired'):>5} "
            f"{total(rs, 'not in the ledger'):>4} {total(rs, 'events stored'):>6} "
            f"{total(rs, 'Alertmanager sends failed'):>10} "
            f"{total(rs, 'Slurm requeues'):>8} {total(rs, 'Slurm drains'):>6} "
            f"{sum(not x['ok'] for x in rs):>6} {lead:>16}"
        )
    print(
        "(to a leader: median / max seconds; a fault that took the leader out: from its start "
        "until another replica leads; the database's: from its end until one leads)"
    )
    windows = sorted(w for row in rows for w in cast(list[float], row.get("act windows ms", [])))
    if windows:
        print(
            f"acts: {len(windows)}; from the last check to the command's end (ms): median "
            f"{statistics.median(windows):.1f}, p95 {windows[int(0.95 * (len(windows) - 1))]:.1f}, "
            f"max {windows[-1]:.1f}"
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stack", default=None)
    p.add_argument("--port-base", type=int, default=24000)
    p.add_argument("--replicas", type=int, choices=(2, 3), default=3)
    p.add_argument(
        "--fault", choices=list(FAULTS), action="append", help="only these faults (repeatable)"
    )
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    if args.stack:
        os.environ["SLURMEDIC_LAB_STACK"] = args.stack
    tmp = Path(tempfile.mkdtemp(prefix="slurmedic-faults-"))
    cfg = LabConfig(run_dir=tmp / "lab", port_base=args.port_base)
    print(f"seed {seed}; lab {cfg.run_dir} ({cfg.stack}); {args.replicas} replicas, lease {LEASE}s")
    rows: list[dict[str, object]] = []
    # Every fault once before any twice, then at random; the point always at random.
    order = args.fault or list(FAULTS)
    rng.shuffle(order)
    faults = [order[i % len(order)] if i < len(order) else rng.choice(order)
              for i in range(args.rounds)]  # fmt: skip

    # A SIGTERM ends the run through its `finally`: the lab goes down, the disks unmounted.
    # Once: a second one (`timeout` passes its own on) would cut that cleanup short.
    def terminate(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)

    signal.signal(signal.SIGTERM, terminate)
    manage.up(cfg)
    try:
        monitoring.add_peer(cfg)
        with replicas(cfg, tmp, "abc"[: args.replicas], "faults_bench") as r:
            for n, fault in enumerate(faults, 1):
                point = rng.choice(POINTS)
                row = one_round(r, fault, point)
                rows.append(row)
                print(f"round {n}: {row}", flush=True)
    finally:
        manage.down(cfg)
        shutil.rmtree(postgres.data_dir(cfg), ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        table(rows)


if __name__ == "__main__":
    main()
