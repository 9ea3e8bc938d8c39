"""scontrol and scancel over slurmrestd (adapters/rest_commands.py): which REST call each command
becomes, what an API that lacks one says, and the lines the playbooks read, from the JSON the
lab captured of each release. Against a loopback server that records what it was asked; the
lab holds the stand-ins against the real slurmrestd and scontrol of every release
(tests/lab/test_rest_commands.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.json_server import JsonHandler, serving
from webhook.adapters import rest_commands
from webhook.adapters.rest_commands import Usage, job_line, node_line, run
from webhook.adapters.slurm import SlurmError
from webhook.adapters.slurmrest import SlurmRest, Token
from webhook.core.policy import load_policy
from webhook.executor.dispatch import TRANSIENT
from webhook.service.config import Cluster

DATA = Path(__file__).parents[1] / "data" / "slurm"


class Fake:
    def __init__(self, api: str) -> None:
        self.api = api
        self.asked: list[tuple[str, str, Any]] = []
        self.answer: dict[str, Any] = {}


@pytest.fixture
def server() -> Iterator[tuple[Fake, str]]:
    fake = Fake("v0.0.42")

    class Handler(JsonHandler):
        def handle_any(self) -> None:
            body = self.body()
            if self.path == "/openapi/v3":
                return self.reply(200, {"paths": {f"/slurm/{fake.api}/nodes": {}}})
            fake.asked.append((self.command, self.path, body))
            return self.reply(200, fake.answer)

        do_GET = do_POST = do_DELETE = handle_any

    with serving(Handler) as url:
        yield fake, url


def client(url: str, tmp_path: Path) -> SlurmRest:
    (tmp_path / "jwt").write_text("SLURM_JWT=good\n")
    return SlurmRest(url, "slurmedic", Token(file=tmp_path / "jwt"))


def test_each_act_is_one_rest_call_per_object(server: tuple[Fake, str], tmp_path: Path) -> None:
    fake, url = server
    rest = client(url, tmp_path)
    reason = "slurmedic: 1001.0 gpu_hardware"
    run("scontrol", ["update", "nodename=gpu[01-02]", "state=drain", f"reason={reason}"], rest)
    run("scontrol", ["update", "NodeName=gpu03", "State=RESUME"], rest)
    run("scontrol", ["update", "jobid=1001", "ExcNodeList=gpu[01-02]"], rest)
    run("scontrol", ["release", "1001"], rest)
    run("scancel", ["1001"], rest)
    assert fake.asked == [
        ("POST", "/slurm/v0.0.42/node/gpu01", {"state": ["DRAIN"], "reason": reason}),
        ("POST", "/slurm/v0.0.42/node/gpu02", {"state": ["DRAIN"], "reason": reason}),
        ("POST", "/slurm/v0.0.42/node/gpu03", {"state": ["RESUME"]}),
        ("POST", "/slurm/v0.0.42/job/1001", {"excluded_nodes": "gpu[01-02]"}),
        ("POST", "/slurm/v0.0.42/job/1001", {"hold": False}),
        ("DELETE", "/slurm/v0.0.42/job/1001", None),
    ]
    assert run("scontrol", ["show", "hostnames", "gpu[01-03]"], rest) == "gpu01\ngpu02\ngpu03\n"


def test_what_an_api_lacks_is_one_error_naming_the_release_that_has_it(
    server: tuple[Fake, str], tmp_path: Path
) -> None:
    fake, url = server
    with pytest.raises(SlurmError, match=r"v0\.0\.42 has no requeue \(Slurm 26\.05"):
        run("scontrol", ["requeuehold", "1001"], client(url, tmp_path))
    fake.api = "v0.0.38"
    with pytest.raises(SlurmError, match=r"v0\.0\.38 has no node update \(Slurm 23\.02"):
        run("scontrol", ["update", "nodename=gpu01", "state=resume"], client(url, tmp_path))
    with pytest.raises(SlurmError, match="slurmrestd has no reboot"):
        run("scontrol", ["reboot", "ASAP", "nextstate=DOWN", "gpu01"], client(url, tmp_path))
    assert fake.asked == []  # nothing was sent
    fake.api = "v0.0.45"
    run("scontrol", ["requeuehold", "1001"], client(url, tmp_path))
    assert fake.asked == [("GET", "/slurm/v0.0.45/job/1001/requeue?flags=Hold", None)]


def test_a_refusal_slurmrestd_gives_as_a_warning_fails_the_command(
    server: tuple[Fake, str], tmp_path: Path
) -> None:
    fake, url = server
    fake.answer = {"warnings": [{"description": "Job update resulted in non-zero return-code[0]: "
                                                "Invalid job id specified"}]}  # fmt: skip
    with pytest.raises(SlurmError, match="Invalid job id specified"):
        run("scontrol", ["update", "jobid=9", "ExcNodeList=gpu01"], client(url, tmp_path))


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["update", "nodename=gpu01", "state=down", "reason=x"],
        ["update", "nodename=gpu01", "state=drain"],  # a drain needs its reason
        ["update", "jobid=1", "TimeLimit=5"],
        ["update", "nodename"],
        ["requeuehold", "1; rm -rf /"],
        ["update", "nodename=gpu01/../../jobs?x", "state=resume"],
        ["update", "jobid=1", "ExcNodeList=gpu01,../x"],
        ["show", "node", "gpu01?update_time=1"],
        ["show", "partition", "gpu"],
        ["show", "job", "s0ABC"],
        ["cancel", "1"],
    ],
)
def test_a_command_the_playbooks_never_run_is_refused(
    server: tuple[Fake, str], tmp_path: Path, args: list[str]
) -> None:
    fake, url = server
    with pytest.raises(Usage):
        run("scontrol", args, client(url, tmp_path))
    assert fake.asked == []


@pytest.mark.parametrize("release", ["22.05.8", "24.11.5", "26.05.5"])
def test_the_lines_carry_the_fields_the_playbooks_read(release: str) -> None:
    files = {p.name: json.loads(p.read_text()) for p in (DATA / release).glob("*.json")}
    nodes = (files.get("nodes.json") or files["sinfo.json"])["nodes"]
    jobs = (files.get("jobs.json") or files["squeue.json"])["jobs"]
    for n in nodes:
        line = node_line(n)
        assert line.startswith(f"NodeName={n['name']} Gres={n.get('gres') or '(null)'} State=")
        state = line.split(" State=")[1].split(" ")[0]
        assert state.split("+")[0] in ("IDLE", "ALLOCATED", "MIXED", "DOWN"), line
        if n.get("reason"):
            assert f" Reason={n['reason']} [" in line
    for j in jobs:
        line = job_line(j)
        for field in ("JobId", "JobState", "Reason", "Restarts", "NodeList", "ExcNodeList"):
            assert f" {field}=" in f" {line}", line


def test_a_drained_node_and_a_held_job_read_as_scontrol_prints_them() -> None:
    node = {"name": "gpu02", "state": ["IDLE", "DRAIN"], "reason": "slurmedic: node:gpu02 xid",
            "reason_set_by_user": "slurm",
            "reason_changed_at": {"set": True, "number": 0}}  # fmt: skip
    assert node_line(node) == (
        "NodeName=gpu02 Gres=(null) State=IDLE+DRAIN Reason=slurmedic: node:gpu02 xid "
        "[slurm@Unknown]"
    )
    old = {"name": "gpu02", "state": "down", "state_flags": ["DRAIN", "NOT_RESPONDING"]}
    old["gres"] = "gpu:8"
    assert node_line(old) == "NodeName=gpu02 Gres=gpu:8 State=DOWN+DRAIN+NOT_RESPONDING"
    job = {"job_id": 7, "job_state": ["PENDING", "REQUEUE_HOLD"], "state_reason": "JobHeldUser",
           "state_description": "job requeued in held state", "restart_cnt": 1,
           "exit_code": {"status": ["EXIT"], "return_code": {"set": True, "number": 93}},
           "nodes": "", "excluded_nodes": "gpu[02-03]", "requeue": True}  # fmt: skip
    assert job_line(job) == (
        "JobId=7 JobState=REQUEUE_HOLD Reason=job_requeued_in_held_state Requeue=1 Restarts=1 "
        "ExitCode=93:0 NodeList=(null) ExcNodeList=gpu[02-03]"
    )


def test_over_rest_the_playbooks_find_the_stand_ins_first_on_their_path(
    server: tuple[Fake, str], tmp_path: Path
) -> None:
    fake, url = server
    (tmp_path / "jwt").write_text("good")
    cluster = Cluster.model_validate(
        {"slurm": "rest", "rest": {"url": url, "token_file": str(tmp_path / "jwt")}}
    )
    env = cluster.playbook_env()
    first = Path(env["PATH"].split(os.pathsep)[0])
    for prog in ("scontrol", "scancel"):
        assert (first / prog).stat().st_mode & stat.S_IXUSR
    assert stat.S_IMODE(first.stat().st_mode) == 0o700  # this process's own
    assert Cluster().playbook_env() == Cluster().slurm_env()  # the commands: nothing added
    assert rest_commands.ENV not in cluster.slurm_env()

    # As a playbook's task runs it: a command line, the settings from the environment.
    fake.answer = {"jobs": [{"job_id": 5, "job_state": ["RUNNING"], "restart_cnt": 2,
                             "nodes": "gpu[01-02]"}]}  # fmt: skip
    shown = subprocess.run(
        ["scontrol", "show", "job", "5", "--oneliner"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "JobState=RUNNING" in shown.stdout and " Restarts=2 " in shown.stdout
    refused = subprocess.run(
        ["scontrol", "requeuehold", "5"], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert refused.returncode == 1
    assert refused.stderr.strip().startswith("scontrol (over slurmrestd): slurmrestd v0.0.42")


def test_what_each_release_s_api_lets_the_playbooks_do() -> None:
    """What `slurmedic doctor` says of a REST site (docs/slurmrestd.md's table)."""
    always = ["stop", "release", "exclude nodes"]
    assert rest_commands.acts("v0.0.38") == (always, ["drain", "resume", "requeue", "reboot"])
    assert rest_commands.acts("v0.0.42") == (["drain", "resume", *always], ["requeue", "reboot"])
    assert rest_commands.acts("v0.0.45") == (["drain", "resume", "requeue", *always], ["reboot"])


def test_slurmrestd_out_of_reach_is_a_transient_error_and_a_missing_act_is_not() -> None:
    """The executor retries a run that failed for a moment (dispatch.TRANSIENT), never one the
    API cannot do."""
    down = ("scontrol (over slurmrestd): GET http://127.0.0.1:6820/slurm/v0.0.45/job/5: "
            "HTTPConnectionPool(host='127.0.0.1', port=6820): Max retries exceeded "
            "(Caused by NewConnectionError(...: [Errno 111] Connection refused'))")  # fmt: skip
    assert TRANSIENT.search(down)
    busy = "scancel (over slurmrestd): DELETE http://h/slurm/v0.0.42/job/5: HTTP 503: busy"
    assert TRANSIENT.search(busy)
    lacking = ("scontrol (over slurmrestd): slurmrestd v0.0.42 has no requeue (Slurm 26.05 "
               "(v0.0.45) and later have one): run this playbook where ...")  # fmt: skip
    assert not TRANSIENT.search(lacking)


def test_over_rest_a_reboot_s_repair_goes_to_a_person(tmp_path: Path) -> None:
    """slurmrestd has no reboot: `serve` takes repairs.reboot as false over REST, and says so."""
    (tmp_path / "jwt").write_text("good")
    rest = Cluster.model_validate(
        {"slurm": "rest", "rest": {"url": "http://h:6820", "token_file": str(tmp_path / "jwt")}}
    )
    policy = load_policy({"repairs": {"enabled": True}})
    fitted, said = rest.fit(policy)
    assert policy.repairs.reboot and not fitted.repairs.reboot
    assert fitted.repairs.model_dump() == {**policy.repairs.model_dump(), "reboot": False}
    assert "slurmrestd has no reboot" in said
    assert Cluster().fit(policy) == (policy, "")  # the commands reboot
    off = load_policy({"repairs": {"enabled": True, "reboot": False}})
    assert rest.fit(off) == (off, "")
