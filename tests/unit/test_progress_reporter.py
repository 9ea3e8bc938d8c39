"""The job-side reporter never disturbs training, reads Slurm's environment, pushes what the
Pushgateway takes, and needs nothing but the standard library."""

import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from webhook import progress
from webhook.progress import ProgressReporter

REPORTER = Path(__file__).resolve().parents[2] / "reporter"


@dataclass
class Push:
    method: str
    path: str
    content_type: str
    body: str


@dataclass
class Gateway:
    url: str
    status: int = 200
    pushes: list[Push] = field(default_factory=list)


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    """A stand-in Pushgateway on loopback that records every request it answers."""
    gw = Gateway(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
            gw.pushes.append(Push("PUT", self.path, self.headers["Content-Type"], body))
            self.send_response(gw.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    gw.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield gw
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def samples(body: str) -> dict[str, float]:
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def test_from_env_reads_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": "3",
        "SLURMD_NODENAME": "gpu07",
        "SLURM_RESTART_COUNT": "2",
        "SLURMEDIC_PUSHGATEWAY": "http://127.0.0.1:1",
    }.items():
        monkeypatch.setenv(k, v)
    r = ProgressReporter.from_env()
    assert (r.job_id, r.rank, r.node, r.attempt, r.gateway) == (
        "42",
        3,
        "gpu07",
        2,
        "http://127.0.0.1:1",
    )


def test_unreachable_gateway_is_counted_not_raised() -> None:
    # Port 1 on loopback refuses at once: the push fails, training goes on.
    r = ProgressReporter(gateway="http://127.0.0.1:1", job_id="1", rank=0, node="gpu01")
    r.step(5, 0.5)
    r.checkpoint(5)
    assert r.failed_pushes == 2


def test_no_gateway_means_no_push() -> None:
    r = ProgressReporter(gateway=None, job_id="1", rank=0, node="gpu01")
    r.step(1, 0.1)
    assert r.failed_pushes == 0
    assert samples(r.exposition())['training_step{node="gpu01"}'] == 1


def test_pushes_replace_the_rank_group(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMEDIC_PUSHGATEWAY", gateway.url)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    r = ProgressReporter.from_env()
    r.step(11, 0.25)
    r.checkpoint(10, written_at=1700000000.5)

    assert [p.method for p in gateway.pushes] == ["PUT"] * 3
    assert {p.path for p in gateway.pushes} == {"/metrics/job/training/slurm_job_id/42/rank/3"}
    assert {p.content_type for p in gateway.pushes} == {"text/plain; version=0.0.4; charset=utf-8"}
    start, stepped, checkpointed = (samples(p.body) for p in gateway.pushes)
    # The start carries only the attempt: a PUT replaces the group, so nothing of the previous
    # attempt's steps stays for the hang rule to read.
    assert set(start) == {
        'training_attempt{node="gpu07"}',
        'training_attempt_start_timestamp_seconds{node="gpu07"}',
    }
    assert start['training_attempt{node="gpu07"}'] == 1
    assert stepped['training_step{node="gpu07"}'] == 11
    assert stepped['training_step_seconds{node="gpu07"}'] == 0.25
    assert checkpointed['training_last_checkpoint_step{node="gpu07"}'] == 10
    assert checkpointed['training_last_checkpoint_timestamp_seconds{node="gpu07"}'] == 1700000000.5
    assert checkpointed['training_step{node="gpu07"}'] == 11
    assert {name.split("{")[0] for name in checkpointed} == set(progress.GAUGES)
    assert r.failed_pushes == 0


def test_rejected_push_is_counted(gateway: Gateway) -> None:
    gateway.status = 400
    r = ProgressReporter(gateway=gateway.url, job_id="7", rank=0, node="gpu01")
    r.step(1, 0.1)
    assert len(gateway.pushes) == 1
    assert r.failed_pushes == 1


def test_grouping_key_and_labels_survive_odd_values(gateway: Gateway) -> None:
    # A job id Slurm would never give, and a node name with a quote: the URL stays one path
    # segment per value (the Pushgateway's base64 form), the label stays one label.
    host = gateway.url.removeprefix("http://")
    r = ProgressReporter(gateway=host + "/", job_id="a/b", rank=0, node='gpu"1')
    r.step(2, 0.5)
    (push,) = gateway.pushes
    assert push.path == "/metrics/job/training/slurm_job_id@base64/YS9i/rank/0"
    assert samples(push.body)['training_step{node="gpu\\"1"}'] == 2


def test_imports_only_the_standard_library() -> None:
    # In a fresh interpreter that sees the reporter's source and nothing installed (-I -S).
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import slurmedic_progress; "
        "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(REPORTER)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "['__main__', 'slurmedic_progress']"
