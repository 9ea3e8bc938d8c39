"""The slurmrestd adapter's own logic: which API version it calls, where the release is read,
when a token is made again, and how a refusal reads. Against a loopback HTTP server that
answers as slurmrestd does (shapes from the lab's captures); the lab's tests read the real
slurmrestd of each release (tests/lab/test_cluster.py)."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.json_server import JsonHandler, serving
from webhook.adapters.slurm import SlurmError
from webhook.adapters.slurmrest import SlurmRest, Token, expiry, release_of
from webhook.service.config import Cluster

DATA = Path(__file__).parents[1] / "data" / "slurm" / "24.11.5"
META = {"meta": {"slurm": {"version": {"major": "24", "minor": "11", "micro": "5"},
                           "release": "24.11.5"}}}  # fmt: skip


def jwt(exp: float) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256'})}.{part({'exp': int(exp), 'sun': 'root'})}.sig"


class Fake:
    """What the fake slurmrestd serves, and what it was asked."""

    def __init__(self) -> None:
        self.valid = {"good"}
        self.refusal = 401  # 24.11 and 26.05 answer 511
        self.seen: list[tuple[str, str]] = []  # (path, token)
        self.paths = ["/slurm/v0.0.40/nodes", "/slurm/v0.0.41/nodes", "/slurm/v0.0.42/nodes",
                      "/slurmdb/v0.0.42/jobs", "/slurm/v0.0.99/nodes"]  # fmt: skip


@pytest.fixture
def fake() -> Iterator[tuple[Fake, str]]:
    state = Fake()
    nodes = json.loads((DATA / "nodes.json").read_text())
    jobs = json.loads((DATA / "jobs.json").read_text())

    class Handler(JsonHandler):
        def do_GET(self) -> None:
            token = self.headers.get("X-SLURM-USER-TOKEN", "")
            state.seen.append((self.path, token))
            if token not in state.valid:
                body = {"errors": [{"description": "Authentication failure", "error_number": 1}]}
                return self.reply(state.refusal, body)
            if self.path == "/openapi/v3":
                return self.reply(200, {"paths": {p: {} for p in state.paths}})
            if self.path.endswith("/nodes"):
                return self.reply(200, {**nodes, **META})
            if self.path.endswith("/jobs"):
                return self.reply(200, {**jobs, **META})
            return self.reply(404, {"errors": [{"description": "Unable find requested URL"}]})

    with serving(Handler) as url:
        yield state, url


def token_file(tmp_path: Path, text: str) -> Token:
    path = tmp_path / "jwt"
    path.write_text(text)
    return Token(file=path)


def test_the_newest_version_it_reads_and_the_view(fake: tuple[Fake, str], tmp_path: Path) -> None:
    state, url = fake
    rest = SlurmRest(url, "root", token_file(tmp_path, "SLURM_JWT=good\n"))
    snap = rest.snapshot()
    # v0.0.99 is not one it reads; slurmdb's paths are not the cluster's.
    assert [p for p, _ in state.seen] == ["/openapi/v3", "/slurm/v0.0.42/nodes",
                                           "/slurm/v0.0.42/jobs"]  # fmt: skip
    assert str(snap.release) == "24.11.5" and snap.nodes and snap.jobs
    assert snap.switches == {}
    pinned = SlurmRest(url, "root", token_file(tmp_path, "good"), api="v0.0.40")
    pinned.snapshot()
    assert state.seen[-1][0] == "/slurm/v0.0.40/jobs"


def test_a_topology_file_gives_the_leaf_switches(fake: tuple[Fake, str], tmp_path: Path) -> None:
    _, url = fake
    topo = tmp_path / "topology.conf"
    topo.write_text(
        "# the site's\nSwitchName=leaf1 Nodes=gpu[01-04]\n"
        "SwitchName=leaf2 Nodes=gpu[05-08] # rack 2\nSwitchName=spine Switches=leaf[1-2]\n"
    )
    rest = SlurmRest(url, "root", token_file(tmp_path, "good"), topology=topo)
    switches = rest.snapshot().switches
    assert switches == {"leaf1": ("gpu01", "gpu02", "gpu03", "gpu04"),
                        "leaf2": ("gpu05", "gpu06", "gpu07", "gpu08")}  # fmt: skip


def test_a_refused_token_is_one_error_naming_the_url(
    fake: tuple[Fake, str], tmp_path: Path
) -> None:
    _, url = fake
    rest = SlurmRest(url, "root", token_file(tmp_path, "SLURM_JWT=stale"))
    with pytest.raises(SlurmError) as e:
        rest.snapshot()
    assert str(e.value) == f"GET {url}/openapi/v3: HTTP 401: Authentication failure"


@pytest.mark.parametrize("refusal", [401, 511])
def test_a_token_command_is_run_again_when_refused_or_about_to_expire(
    fake: tuple[Fake, str], tmp_path: Path, refusal: int
) -> None:
    state, url = fake
    state.refusal = refusal
    counter = tmp_path / "n"
    counter.write_text("0")
    # A command printing a new token each run, as `scontrol token` does: the first is stale.
    script = (
        "import pathlib,sys; p=pathlib.Path(sys.argv[1]); n=int(p.read_text())+1; "
        "p.write_text(str(n)); print(f'SLURM_JWT=t{n}')"
    )
    rest = SlurmRest(url, "root", Token(command=(sys.executable, "-c", script, str(counter))))
    state.valid = {"t2"}
    rest.snapshot()
    assert {t for _, t in state.seen} == {"t1", "t2"}  # refused once, made again, used
    state.valid = {"t2", "t3"}
    rest.snapshot()
    assert counter.read_text() == "2"  # t2 has no expiry it can read: kept for an hour
    rest._expires = time.time() + 30  # within the margin: made again before it is used
    rest.snapshot()
    assert counter.read_text() == "3" and state.seen[-1][1] == "t3"


def test_a_jwt_s_expiry_and_a_response_s_release() -> None:
    at = time.time() + 600
    assert expiry(jwt(at)) == int(at)
    assert expiry("not-a-jwt") is None and expiry("a.b.c") is None
    assert str(release_of(META, "x")) == "24.11.5"
    old = {"meta": {"Slurm": {"version": {"major": 22, "micro": 8, "minor": 5},
                              "release": "22.05.8"}}}  # fmt: skip
    assert str(release_of(old, "x")) == "22.05.8"
    with pytest.raises(SlurmError, match="x: no Slurm release"):
        release_of({"meta": {}}, "x")


@pytest.mark.parametrize(
    ("cluster", "error"),
    [
        ({"slurm": "rest"}, "slurm: rest needs rest:"),
        ({"slurm": "rest", "rest": {"url": "http://h:6820"}}, "one of token_file or token_"),
        ({"slurm": "rest", "rest": {"url": "h:6820", "token_file": "/t"}}, "rest.url"),
        ({"slurm": "rest", "rest": {"url": "http://h", "token_file": "/t", "api": "v1"}},
         "rest.api"),
        ({"slurm": "rest", "rest": {"url": "http://h", "token_command": ["a\nb"]}},
         "printable characters only"),
        ({"slurm": "grpc"}, "slurm"),
    ],
)  # fmt: skip
def test_a_rest_config_that_cannot_work_names_its_key(cluster: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error.replace("(", r"\(")):
        Cluster.model_validate(cluster)
