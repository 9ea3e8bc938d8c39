"""Capture what Slurm's accounting prints on one stack, for a parser's tests: run against a
fresh lab with accounting (`SLURMEDIC_LAB_DIR`, `SLURMEDIC_LAB_PORT_BASE`, `SLURMEDIC_LAB_STACK`
of one that is up, nothing else run on it):

    python tests/data/accounting/capture.py tests/data/accounting

It makes the job histories and node events a parser must read (a completed job, a job that
failed with exit 1, a job requeued once and completed on its second attempt, a job whose node
died, a person's drain and resume, a node DOWN and back) and writes `<stack>/` with
`sacct.json`, `events.txt` (and `events.json` where sacctmgr has --json), `made.json` (what was
made: job ids, nodes, the person), `sacct.txt` (the same jobs, `sacct -P`) and `README.md` (the
exact commands and the versions).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lab import manage, person, processes
from lab.config import LabConfig
from lab.slurm import LabError, node_states, slurm

# The richest field list `sacctmgr show event` takes on 22.05, 24.11 and 26.05.
EVENT_FIELDS = (
    "Cluster,ClusterNodes,NodeName,TimeStart,TimeEnd,Duration,State,StateRaw,Event,EventRaw,"
    "Reason,User,TRES"
)
DRAIN_REASON = "xid 79 on GPU 3, drained by hand"
# `sacct -P`'s fields for `sacct.txt`, every one known to 22.05 and later (22.05's JSON loses
# the exit codes of a failed job: the text has them).
SACCT_FIELDS = (
    "JobID,JobIDRaw,JobName,User,Account,Partition,State,ExitCode,DerivedExitCode,Reason,"
    "NNodes,NodeList,AllocTRES,Submit,Eligible,Start,End,Elapsed,Flags"
)


def wait(what: str, probe: Callable[[], object], timeout: float = 90.0) -> None:
    if not processes.wait_until(lambda: bool(probe()), timeout, 0.3):
        raise SystemExit(f"capture: {what} not reached in {timeout:.0f}s")


def job_state(cfg: LabConfig, job: int) -> tuple[str, int]:
    info = manage.show_job(cfg, job)
    return info.get("JobState", ""), int(info.get("Restarts", "0"))


def ranks_running(cfg: LabConfig, job: int) -> list[str]:
    """The job's nodes once every rank of its current attempt has logged its first line (a
    node killed before that fails the launch instead of the node)."""
    try:
        nodes, attempt = manage.running_job(cfg, job)
    except LabError:
        return []
    for rank, node in enumerate(nodes):
        log = cfg.joblogs / f"slurm-{job}-{node}-{rank}.out"
        if f" job {job} attempt {attempt} on {node}:" not in (
            log.read_text() if log.exists() else ""
        ):
            return []
    return nodes


def events(cfg: LabConfig) -> str:
    return slurm(cfg, "sacctmgr", "-P", "-n", "show", "event", "all_time", f"format={EVENT_FIELDS}")


def sacct_states(cfg: LabConfig, start: str) -> dict[str, list[str]]:
    """Job id to the states of its records (one per attempt with -D), jobs only, no steps."""
    out = slurm(cfg, "sacct", "-D", "-a", "-X", "-n", "-P", "-S", start, "--format=JobID,State")
    states: dict[str, list[str]] = {}
    for line in out.splitlines():
        job, state = line.split("|", 1)
        states.setdefault(job, []).append(state.split()[0])
    return states


def try_json(cfg: LabConfig, argv: list[str]) -> tuple[bool, str]:
    try:
        return True, slurm(cfg, *argv)
    except LabError as e:
        return False, str(e)


def probe(cfg: LabConfig, start: str) -> dict[str, str]:
    """Which spellings this release takes: command (with `<start>`) to what it did."""
    variants = [
        ["sacct", "--json", "-D", "-a", "-S", start],
        ["sacct", "--json", "--duplicates", "--allusers", f"--starttime={start}"],
        ["sacct", "--json", "-D", "-a", "-X", "-S", start],
        ["sacctmgr", "--json", "show", "event", "all_time"],
        ["sacctmgr", "show", "event", "all_time", "--json"],
    ]
    found: dict[str, str] = {}
    for argv in variants:
        ok, text = try_json(cfg, argv)
        key = " ".join(argv).replace(start, "<start>")
        if not ok:
            found[key] = f"refused: {' '.join(text.split())[:200]}"
            continue
        try:
            data = json.loads(text)
        except ValueError:
            found[key] = "exit 0, but prints its table, not JSON"
            continue
        jobs = data.get("jobs")
        steps = sum(len(j.get("steps", [])) for j in jobs) if jobs is not None else None
        found[key] = "JSON" + (f": {len(jobs)} job records, {steps} steps" if jobs else "")
    return found


def main() -> None:
    cfg = LabConfig.from_env()
    if not cfg.accounting:
        raise SystemExit("capture: the lab runs without accounting (SLURMEDIC_LAB_ACCOUNTING=0)")
    out = Path(sys.argv[1]) / cfg.stack
    out.mkdir(parents=True, exist_ok=True)
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 5))
    train = {"step_time": 0.2, "ckpt_every": 5}
    completed = manage.submit_training(cfg, nodes=2, name="completes", steps=15, **train)
    requeued = manage.submit_training(cfg, nodes=2, name="requeued", steps=60, **train)
    node_fail = manage.submit_training(cfg, nodes=2, name="node-dies", requeue=False, **train)
    failed = manage.submit_training(
        cfg, nodes=1, partition="debug", name="crashes", requeue=False, exclude="gpu08", **train
    )
    for job in (requeued, node_fail, failed):
        wait(f"job {job} running on every rank", lambda j=job: ranks_running(cfg, j))
    # A failure with exit 1: the training script's CUDA traceback.
    manage.inject_job(cfg, "crash_cuda", failed, 0)
    # Requeued once by hand, as slurmedic does; the second attempt completes.
    slurm(cfg, "scontrol", "requeue", str(requeued))
    # A node dies under a job that may not be requeued: NODE_FAIL, and the node DOWN.
    dead = ranks_running(cfg, node_fail)[-1]
    manage.kill_node(cfg, dead)
    # A person drains a node by hand and resumes it (the event's User is theirs, not root).
    manage.drain_as(cfg, person.PERSON, "gpu08", DRAIN_REASON)
    wait("the person's drain in the events", lambda: DRAIN_REASON in events(cfg))
    wait(f"job {completed} completed", lambda: job_state(cfg, completed)[0] == "COMPLETED")
    wait(f"job {failed} failed", lambda: job_state(cfg, failed)[0] == "FAILED")
    wait(f"job {node_fail} NODE_FAIL", lambda: job_state(cfg, node_fail)[0] == "NODE_FAIL")
    wait(f"{dead} down", lambda: node_states(cfg)[dead].startswith("down"))
    wait(
        f"job {requeued}'s second attempt completed",
        lambda: job_state(cfg, requeued) == ("COMPLETED", 1),
        timeout=180,
    )
    # The person resumes their node once the jobs are done (a drain of some seconds).
    manage.resume_as(cfg, person.PERSON, "gpu08")
    manage.clear(cfg, dead)  # its slurmd again: the node returns (ReturnToService=1)
    wait(f"{dead} back", lambda: node_states(cfg)[dead] == "idle")
    want = {
        str(completed): ["COMPLETED"],
        str(failed): ["FAILED"],
        str(node_fail): ["NODE_FAIL"],
        str(requeued): ["REQUEUED", "COMPLETED"],
    }
    wait(
        "every attempt in sacct",
        lambda: all(sacct_states(cfg, start).get(j) == s for j, s in want.items()),
    )

    def events_closed() -> bool:
        lines = [ln.split("|") for ln in events(cfg).splitlines()]
        mine = [ln for ln in lines if ln[2] in ("gpu08", dead)]
        return len(mine) >= 2 and all(ln[4] != "Unknown" for ln in mine)

    wait("the drain and the DOWN event ended", events_closed)
    write_samples(cfg, out, start, made={
        "completed": completed,
        "failed": failed,
        "requeued": requeued,
        "node_fail": node_fail,
        "dead_node": dead,
        "drained_by_person": "gpu08",
        "person": person.PERSON,
        "drain_reason": DRAIN_REASON,
        "start": start,
    })  # fmt: skip
    print(out)


def write_samples(cfg: LabConfig, out: Path, start: str, made: dict[str, object]) -> None:
    sacct = ["sacct", "--json", "-D", "-a", "-S", start]
    ok, text = try_json(cfg, sacct)
    if not ok:  # the long form, should a release refuse the short one
        sacct = ["sacct", "--json", "--duplicates", "--allusers", f"--starttime={start}"]
        ok, text = try_json(cfg, sacct)
    if not ok:
        raise SystemExit(f"capture: sacct --json: {text}")
    (out / "sacct.json").write_text(json.dumps(json.loads(text), indent=1) + "\n")
    sacct_text = ["sacct", "-D", "-a", "-P", "-S", start, f"--format={SACCT_FIELDS}"]
    (out / "sacct.txt").write_text(slurm(cfg, *sacct_text))
    ev = ["sacctmgr", "-P", "-n", "show", "event", "all_time", f"format={EVENT_FIELDS}"]
    (out / "events.txt").write_text(slurm(cfg, *ev))
    ev_json = ["sacctmgr", "--json", "show", "event", "all_time"]
    json_ok, json_text = try_json(cfg, ev_json)
    if json_ok:
        try:
            (out / "events.json").write_text(json.dumps(json.loads(json_text), indent=1) + "\n")
        except ValueError:
            json_ok, json_text = False, "exit 0, but prints its table, not JSON"
    version = slurm(cfg, "sacct", "--version").strip()
    spellings = probe(cfg, start)
    made |= {"slurm": version, "sacctmgr_json_event": json_ok, "spellings": spellings}
    (out / "made.json").write_text(json.dumps(made, indent=1) + "\n")
    commands = {"sacct": sacct, "sacct_text": sacct_text, "events": ev, "events_json": ev_json}
    (out / "README.md").write_text(
        readme(cfg, version, start, commands, json_ok, json_text, spellings)
    )


def readme(
    cfg: LabConfig,
    version: str,
    start: str,
    commands: dict[str, list[str]],
    json_ok: bool,
    json_text: str,
    spellings: dict[str, str],
) -> str:
    def shown(argv: list[str]) -> str:
        return " ".join(argv).replace(start, "<start>")

    mariadb = (cfg.logs / "mariadb.log").read_text(errors="replace")
    server = next((ln.split("'")[1] for ln in mariadb.splitlines() if "Version: '" in ln), "?")
    said = " ".join(json_text.split())[:200]
    json_note = "works: `events.json`" if json_ok else f"does not work: `{said}`"
    return f"""# Slurm accounting samples: the `{cfg.stack}` stack ({version})

Captured by `tests/data/accounting/capture.py` on a fresh lab (`SLURMEDIC_LAB_STACK={cfg.stack}
slurmedic lab up`): slurmdbd of the same release, on MariaDB {server}. `made.json` names what
it made:

- `completed`: a 2-node training job that ran its 15 steps (COMPLETED, exit 0);
- `failed`: a 1-node training job whose rank died with a CUDA traceback (FAILED, exit 1);
- `requeued`: a 2-node training job requeued once with `scontrol requeue` while it ran, whose
  second attempt (restart 1) completed;
- `node_fail`: a 2-node `--no-requeue` training job whose node `dead_node` was killed
  (`lab.manage.kill_node`: slurmd and the tasks, SIGKILL): NODE_FAIL; the node went DOWN
  ("Not responding") and came back when its slurmd was started again;
- `drained_by_person`: a node drained and resumed by the person `{person.PERSON}` (a Slurm
  Admin, not root: `lab.manage.drain_as`/`resume_as`), with the reason `drain_reason`.

Commands (SLURM_CONF of the lab; `<start>` is `start` in `made.json`, local time):

- `sacct.json`: `{shown(commands["sacct"])}`
- `sacct.txt`: `{shown(commands["sacct_text"])}`
- `events.txt`: `{shown(commands["events"])}`
- `{shown(commands["events_json"])}`: {json_note}

What this release does with each spelling (`spellings` in `made.json`):

{chr(10).join(f"- `{k}`: {v}" for k, v in spellings.items())}
"""


if __name__ == "__main__":
    main()
