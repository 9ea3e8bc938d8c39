"""The job-side reporter never disturbs training, reads Slurm's environment, pushes what the
Pushgateway takes, and needs nothing but the standard library.

Pushes happen in a background thread, so a test that needs one waits for it (`flush()`, or
the stand-in gateway's own record), never for a guessed time."""

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import slurmedic_progress

from tests.local_server import put_server
from webhook import progress
from webhook.progress import ProgressReporter

REPORTER = Path(__file__).resolve().parents[2] / "reporter"
# A deadline for what should happen at once: only reached when the code under test is broken.
WAIT = 30.0
# An interval no test lives to see the end of: only a start, a checkpoint, flush() or close()
# make a push go before it.
NEVER = 3600.0


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
    # hang(): every request is held, unanswered, until `release` is set.
    hanging: bool = False
    held: threading.Event = field(default_factory=threading.Event)  # a request is being held
    release: threading.Event = field(default_factory=threading.Event)
    answered: threading.Condition = field(default_factory=threading.Condition)

    def hang(self) -> None:
        self.hanging = True

    def wait_for_pushes(self, n: int) -> list[Push]:
        with self.answered:
            assert self.answered.wait_for(lambda: len(self.pushes) >= n, WAIT), self.pushes
            return list(self.pushes)


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    """A stand-in Pushgateway on loopback that records every request it answers."""
    gw = Gateway(url="")

    def answer(path: str, content_type: str, body: str) -> int:
        if gw.hanging:
            gw.held.set()
            gw.release.wait()
        with gw.answered:
            gw.pushes.append(Push("PUT", path, content_type, body))
            gw.answered.notify_all()
        return gw.status

    with put_server(answer, on_stop=gw.release.set) as gw.url:
        yield gw


def closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def pushers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("slurmedic-progress")}


def samples(body: str) -> dict[str, float]:
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def reporter(
    url: str | None,
    interval: float = slurmedic_progress.DEFAULT_INTERVAL,
    timeout: float = slurmedic_progress.DEFAULT_TIMEOUT,
) -> ProgressReporter:
    return ProgressReporter(
        gateway=url, job_id="7", rank=0, node="gpu01", interval=interval, timeout=timeout
    )


def test_from_env_reads_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    for k, v in {
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": "3",
        "SLURMD_NODENAME": "gpu07",
        "SLURM_RESTART_COUNT": "2",
        "SLURMEDIC_PUSHGATEWAY": url,
        "SLURMEDIC_PUSH_INTERVAL": "30",
    }.items():
        monkeypatch.setenv(k, v)
    r = ProgressReporter.from_env()
    r.close()
    assert (r.job_id, r.rank, r.node, r.attempt, r.gateway, r.interval) == (
        "42",
        3,
        "gpu07",
        2,
        url,
        30.0,
    )


@pytest.mark.parametrize("raw", ["fast", "-1", "nan"])
def test_an_unusable_interval_warns_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.delenv("SLURMEDIC_PUSHGATEWAY", raising=False)
    monkeypatch.setenv("SLURMEDIC_PUSH_INTERVAL", raw)
    with pytest.warns(UserWarning, match="SLURMEDIC_PUSH_INTERVAL"):
        r = ProgressReporter.from_env()
    assert r.interval == slurmedic_progress.DEFAULT_INTERVAL


def test_unreachable_gateway_is_counted_not_raised() -> None:
    r = reporter(f"http://127.0.0.1:{closed_port()}")
    r.step(5, 0.5)
    r.checkpoint(5)
    assert r.flush(WAIT)
    r.close()
    # The step may have been superseded by the checkpoint before the pusher took it.
    assert r.failed_pushes >= 1
    assert r.failed_pushes + r.dropped_snapshots == 2
    assert r.pushes == 0


def test_no_gateway_means_no_push_and_no_thread() -> None:
    before = pushers()
    r = reporter(None)
    r.start()
    r.step(1, 0.1)
    r.checkpoint(1)
    assert r.flush(WAIT)
    assert pushers() == before
    r.close()
    assert (r.pushes, r.failed_pushes, r.dropped_snapshots) == (0, 0, 0)
    assert samples(r.exposition())['training_step{node="gpu01"}'] == 1


def test_pushes_replace_the_rank_group(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMEDIC_PUSHGATEWAY", gateway.url)
    monkeypatch.setenv("SLURMEDIC_PUSH_INTERVAL", str(NEVER))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    # flush() after each call: each snapshot goes, whatever the interval.
    r = ProgressReporter.from_env()
    assert r.flush(WAIT)
    r.step(11, 0.25, quality=2.5)
    assert r.flush(WAIT)
    r.resumed(10, written_at=1700000000.5)
    assert r.flush(WAIT)
    r.close()

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
    assert checkpointed['training_resume_step{node="gpu07"}'] == 10
    assert checkpointed['training_quality{node="gpu07"}'] == 2.5
    assert {name.split("{")[0] for name in checkpointed} == set(progress.GAUGES)
    assert (r.pushes, r.failed_pushes, r.dropped_snapshots) == (3, 0, 0)


def test_steps_are_pushed_at_most_once_an_interval(gateway: Gateway) -> None:
    r = reporter(gateway.url, interval=NEVER)
    r.start()
    # The start goes at once, by itself.
    gateway.wait_for_pushes(1)
    for i in range(1, 101):
        r.step(i, 0.1)
    # Every step waits out the interval, superseded by the next, until flush().
    assert r.flush(WAIT)
    r.close()
    assert len(gateway.pushes) == r.pushes == 2
    assert r.dropped_snapshots == 99
    assert samples(gateway.pushes[-1].body)['training_step{node="gpu01"}'] == 100


def test_a_checkpoint_does_not_wait_for_the_interval(gateway: Gateway) -> None:
    r = reporter(gateway.url, interval=NEVER)
    r.start()
    assert r.flush(WAIT)
    for i in range(1, 11):
        r.step(i, 0.1)
    r.checkpoint(10)
    # No flush(): the checkpoint goes by itself, with the steps before it.
    last = samples(gateway.wait_for_pushes(2)[-1].body)
    r.close()
    assert last['training_last_checkpoint_step{node="gpu01"}'] == 10
    assert last['training_step{node="gpu01"}'] == 10


def test_a_hung_gateway_costs_the_steps_nothing(gateway: Gateway) -> None:
    gateway.hang()
    # A push timeout longer than the test: only the gateway's answer ends the first push.
    r = reporter(gateway.url, interval=0, timeout=NEVER)

    def train() -> None:
        r.start()
        gateway.held.wait(WAIT)
        for i in range(1, 201):
            r.step(i, 0.1)

    # In a thread of its own, so that a reporter that blocks fails the test instead of hanging it.
    training = threading.Thread(target=train, daemon=True)
    training.start()
    training.join(WAIT)
    assert not training.is_alive()
    # Every step returned while the gateway still holds the first push, unanswered; each
    # snapshot but the last was superseded while the pusher waited.
    assert gateway.held.is_set()
    assert not gateway.release.is_set()
    assert gateway.pushes == []
    assert (r.pushes, r.failed_pushes, r.dropped_snapshots) == (0, 0, 199)
    gateway.release.set()
    assert r.flush(WAIT)
    r.close()
    assert samples(gateway.pushes[-1].body)['training_step{node="gpu01"}'] == 200
    assert (r.pushes, r.failed_pushes, r.dropped_snapshots) == (2, 0, 199)


def test_a_dead_gateway_costs_the_steps_nothing() -> None:
    r = reporter(f"http://127.0.0.1:{closed_port()}", interval=0)
    r.start()
    for i in range(1, 51):
        r.step(i, 0.1)
    assert r.flush(WAIT)
    r.close()
    assert r.pushes == 0
    assert r.failed_pushes >= 1
    # Every snapshot was either tried or superseded.
    assert r.failed_pushes + r.dropped_snapshots == 51


def test_rejected_push_is_counted(gateway: Gateway) -> None:
    gateway.status = 400
    r = reporter(gateway.url)
    r.step(1, 0.1)
    assert r.flush(WAIT)
    r.close()
    assert len(gateway.pushes) == 1
    assert (r.pushes, r.failed_pushes) == (0, 1)


def test_close_pushes_the_last_snapshot_and_stops(gateway: Gateway) -> None:
    before = pushers()
    r = reporter(gateway.url, interval=NEVER)
    r.start()
    for i in range(1, 6):
        r.step(i, 0.1)
    r.close(timeout=WAIT)
    assert samples(gateway.pushes[-1].body)['training_step{node="gpu01"}'] == 5
    assert pushers() == before
    # After close(), values still change, but nothing is pushed or started.
    r.step(6, 0.1)
    assert pushers() == before
    assert samples(r.exposition())['training_step{node="gpu01"}'] == 6
    assert samples(gateway.pushes[-1].body)['training_step{node="gpu01"}'] == 5


def test_the_context_manager_closes(gateway: Gateway) -> None:
    with reporter(gateway.url, interval=NEVER) as r:
        r.start()
        r.step(3, 0.1)
    assert samples(gateway.pushes[-1].body)['training_step{node="gpu01"}'] == 3
    assert r.pushes == len(gateway.pushes)


def test_close_gives_up_on_a_hung_gateway(gateway: Gateway) -> None:
    gateway.hang()
    before = pushers()
    r = reporter(gateway.url, interval=NEVER, timeout=NEVER)
    r.start()
    assert gateway.held.wait(WAIT)
    r.step(1, 0.1)
    (thread,) = pushers() - before
    r.close(timeout=0.1)
    # close() returned and its pusher ends, while the gateway still holds the push: close()
    # cut the connection (the push's own timeout is longer than the test).
    thread.join(WAIT)
    assert not thread.is_alive()
    assert not gateway.release.is_set()
    assert (r.pushes, r.failed_pushes, r.dropped_snapshots) == (0, 1, 1)


EXIT_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from slurmedic_progress import ProgressReporter
r = ProgressReporter(gateway=sys.argv[2], job_id="9", rank=0, node="gpu01", interval=3600.0,
                     timeout=3600.0)
r.start()
for i in range(1, 4):
    r.step(i, 0.1)
sys.exit(1)  # a crash, without close(): the last step goes at exit all the same
"""


def test_the_last_step_is_pushed_at_exit(gateway: Gateway) -> None:
    subprocess.run(
        [sys.executable, "-I", "-S", "-c", EXIT_SCRIPT, str(REPORTER), gateway.url],
        timeout=WAIT,
        check=False,
    )
    assert samples(gateway.pushes[-1].body)['training_step{node="gpu01"}'] == 3


def test_a_hung_gateway_does_not_hold_the_exit(gateway: Gateway) -> None:
    gateway.hang()
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", EXIT_SCRIPT, str(REPORTER), gateway.url],
        timeout=WAIT,
        check=False,
    )
    # The process ended (its pushes' timeout is an hour) while the gateway still held it.
    assert proc.returncode == 1
    assert gateway.held.is_set()
    assert not gateway.release.is_set()


def test_grouping_key_and_labels_survive_odd_values(gateway: Gateway) -> None:
    # A job id Slurm would never give, and a node name with a quote: the URL stays one path
    # segment per value (the Pushgateway's base64 form), the label stays one label.
    host = gateway.url.removeprefix("http://")
    r = ProgressReporter(gateway=host + "/", job_id="a/b", rank=0, node='gpu"1')
    r.step(2, 0.5)
    assert r.flush(WAIT)
    r.close()
    (push,) = gateway.pushes
    assert push.path == "/metrics/job/training/slurm_job_id@base64/YS9i/rank/0"
    assert samples(push.body)['training_step{node="gpu\\"1"}'] == 2


def test_a_value_that_is_no_number_fails_in_the_caller() -> None:
    r = reporter(f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(ValueError):
        r.step(1, "fast")  # type: ignore[arg-type]
    r.close()


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


def test_a_start_from_scratch_reports_resume_step_zero_and_no_checkpoint(gateway: Gateway) -> None:
    r = reporter(gateway.url)
    r.resumed(0)
    r.step(1, 0.1)  # without a quality: none is sent
    assert r.flush(WAIT)
    r.close()
    last = samples(gateway.pushes[-1].body)
    assert last['training_resume_step{node="gpu01"}'] == 0
    assert not any(k.startswith(("training_last_checkpoint", "training_quality")) for k in last)


def test_a_quality_that_is_not_a_number_fails_in_the_caller(gateway: Gateway) -> None:
    r = reporter(gateway.url)
    with pytest.raises(ValueError):
        r.step(1, 0.1, quality="low")  # type: ignore[arg-type]
    r.close()
