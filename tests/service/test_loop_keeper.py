"""serve's loops are forked by its keeper (webhook/cli/keeper.py), a process forked from serve
before any thread: each loop shares the pages of what serve imported. The keeper says how each
loop ended, ends with serve, and once it is gone serve starts its loops as processes of their
own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from lab.processes import is_alive, parent_of
from tests.lab.conftest import eventually
from tests.local_server import comm, loop_runs, serve_children, start_server, stop_server
from webhook.cli.keeper import KEEPER_NAME, LOOP_NAME, Keeper, KeeperGone


def memory_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value)
    return fields


def loop_and_keeper(pid: int) -> tuple[int, int]:
    """serve's (`pid`) loop, and that loop's parent."""
    (loop,) = serve_children(pid, loop=True)
    keeper = parent_of(loop)
    assert keeper is not None
    return loop, keeper


def test_the_loop_is_forked_by_serve_s_keeper_and_shares_what_serve_imported(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path)
    try:
        loop, keeper = loop_and_keeper(server.proc.pid)
        assert parent_of(keeper) == server.proc.pid
        assert (comm(keeper), comm(loop)) == (KEEPER_NAME, LOOP_NAME)
        # A loop started as a process of its own holds its imports alone (some 54 MB private,
        # 18 shared, measured); forked, most of its pages are serve's too.
        m = memory_kb(loop)
        shared = m["Shared_Clean"] + m["Shared_Dirty"]
        private = m["Private_Clean"] + m["Private_Dirty"]
        assert shared > private, m
    finally:
        stop_server(server.proc)


def test_with_its_keeper_killed_serve_starts_its_loop_as_a_process_of_its_own(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path, replicas={"name": "replica-a", "lease_seconds": 3})
    try:
        loop, keeper = loop_and_keeper(server.proc.pid)
        os.kill(keeper, signal.SIGKILL)
        # The orphaned loop sees its parent change and stops by itself (serve would kill it
        # only after executor.timeout_seconds + 10, 130 s here).
        eventually(lambda: not is_alive(loop), timeout=30, what="the orphaned loop to stop")
        (again,) = eventually(
            lambda: [p for p in serve_children(server.proc.pid, loop=True) if p != loop],
            timeout=60,
            what="a new loop",
        )
        assert parent_of(again) == server.proc.pid
        assert b"loop" in Path(f"/proc/{again}/cmdline").read_bytes().split(b"\0")
        eventually(
            lambda: loop_runs(server.url),
            timeout=60,
            what="/readyz: the loop runs again",
        )
        log = (tmp_path / "serve.out").read_text()
        assert f"the loop's parent (pid {keeper}: serve, or its keeper) is gone" in log, log
        assert "the loop's keeper is gone" in log, log
        assert "each loop is started as a process of its own from now on" in log, log
    finally:
        stop_server(server.proc)


def test_a_hangup_of_serve_s_terminal_stops_neither_its_keeper_nor_its_loop(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path)
    try:
        loop, keeper = loop_and_keeper(server.proc.pid)
        workers = set(serve_children(server.proc.pid, loop=False))
        assert workers
        # To the whole process group, as a closing terminal sends it (serve leads its own).
        os.killpg(server.proc.pid, signal.SIGHUP)
        # gunicorn's master takes it as its reload and replaces its workers: by then each
        # process of the group has had the signal (SIGHUP's default would have ended it).
        eventually(
            lambda: not workers & set(serve_children(server.proc.pid, loop=False)),
            timeout=60,
            what="gunicorn's workers replaced",
        )
        assert is_alive(keeper) and is_alive(loop)
        assert serve_children(server.proc.pid, loop=True) == [loop]
        assert loop_runs(server.url)
        assert "keeper is gone" not in (tmp_path / "serve.out").read_text()
    finally:
        stop_server(server.proc)


# A process that forks a keeper and asks it for a loop N times (argv), each ending as HOW says
# (the keeper's environment), then prints what the keeper said of each; with ORPHAN set, it
# leaves the first loop running and ends without a word.
KEEPER_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from webhook.cli.keeper import Keeper

    def run(word_fd, parent):
        assert parent == os.getppid()  # the keeper, which forked it
        how = os.environ["HOW"]
        if how == "word":
            os.write(word_fd, b"stopped")
            return 0
        if how == "exit3":
            sys.exit(3)
        if how == "raise":
            raise RuntimeError("the loop's own error")
        time.sleep(600)  # "wait": until a signal
        return 0

    keeper = Keeper(run)
    out = []
    for _ in range(int(sys.argv[1])):
        said, write = os.pipe()
        loop = keeper.start(write)
        os.close(write)
        if os.environ.get("ORPHAN"):
            print(json.dumps({"keeper": keeper.pid, "loop": loop.pid}), flush=True)
            os._exit(0)
        if os.environ["HOW"] == "wait":
            loop.terminate()
        code = loop.wait(60)
        os.set_blocking(said, False)
        try:
            word = os.read(said, 64).decode()
        except BlockingIOError:
            word = ""
        out.append({"code": code, "word": word})
    print(json.dumps(out))
    """
)


def keeper_run(how: str, loops: int = 1, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", KEEPER_SCRIPT, str(loops)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "HOW": how, **env},
    )


@pytest.mark.parametrize(
    ("how", "code", "word"),
    [
        ("word", 0, "stopped"),
        ("exit3", 3, ""),
        ("raise", 1, ""),  # as an uncaught exception ends a process, its traceback said
        ("wait", -signal.SIGTERM, ""),
    ],
)
def test_the_keeper_says_how_each_loop_ended(how: str, code: int, word: str) -> None:
    proc = keeper_run(how, 3)  # loop after loop, from one keeper
    assert json.loads(proc.stdout) == [{"code": code, "word": word}] * 3
    if how == "raise":
        assert proc.stderr.count("RuntimeError: the loop's own error") == 3


def test_the_keeper_stops_its_loop_and_ends_when_its_parent_has(tmp_path: Path) -> None:
    # Not through pipes: the keeper and the loop would hold them, and the run's end would wait
    # for theirs.
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as o, err.open("w") as e:
        parent = subprocess.Popen(
            [sys.executable, "-c", KEEPER_SCRIPT, "1"],
            stdout=o,
            stderr=e,
            env={**os.environ, "HOW": "wait", "ORPHAN": "1"},
        )
    assert parent.wait(120) == 0
    pids = json.loads(out.read_text())
    eventually(lambda: not is_alive(pids["loop"]), timeout=30, what="the loop stopped")
    eventually(lambda: not is_alive(pids["keeper"]), timeout=30, what="the keeper ended")
    assert f"serve (pid {parent.pid}) is gone: the loop stops" in err.read_text()


def test_no_keeper_is_forked_from_a_process_that_runs_threads() -> None:
    release = threading.Event()
    other = threading.Thread(target=release.wait, name="busy")
    other.start()
    try:
        with pytest.raises(KeeperGone, match=r"already runs threads .*busy"):
            Keeper(lambda _fd: 0)
    finally:
        release.set()
        other.join()


SUPERVISED_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    from webhook.cli.keeper import Keeper
    from webhook.cli.serve import LoopSupervisor

    marker = Path(sys.argv[1])

    def run(word_fd, parent):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a loop that outlasts its grace
        marker.write_text(str(os.getpid()))
        time.sleep(600)
        return 0

    keeper = Keeper(run)
    # Were the loop started as a process of its own, it would say so in the marker.
    spawned = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('spawned')"]
    sup = LoopSupervisor(spawned, {}, grace=1, keeper=keeper)
    if sys.argv[2] == "stopped first":
        sup.stop()
        sup.start()
        sup.thread.join(30)
        print(json.dumps({"proc": sup.proc is not None, "marker": marker.exists()}))
        sys.exit(0)
    sup.start()
    while not marker.exists():
        time.sleep(0.05)
    loop = int(marker.read_text())
    sup.stop()
    sup.thread.join(30)
    try:
        os.waitpid(keeper.pid, os.WNOHANG)
        reaped = False
    except ChildProcessError:
        reaped = True
    print(json.dumps({
        "code": sup.proc.returncode, "supervising": sup.thread.is_alive(),
        "loop_alive": Path(f"/proc/{loop}").exists(), "keeper_reaped": reaped,
        "marker": marker.read_text(),
    }))
    """
)


def supervised(tmp_path: Path, case: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", SUPERVISED_SCRIPT, str(tmp_path / "marker"), case],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_a_loop_that_outlasts_its_grace_at_serve_s_stop_is_killed_and_the_keeper_reaped(
    tmp_path: Path,
) -> None:
    said = supervised(tmp_path, "outlasts")
    assert said["code"] == -signal.SIGKILL, said
    assert said["supervising"] is False, said  # not started again, in any way
    assert said["loop_alive"] is False, said
    assert said["keeper_reaped"] is True, said
    assert said["marker"] != "spawned", said


def test_a_supervisor_stopped_before_it_starts_starts_no_loop(tmp_path: Path) -> None:
    assert supervised(tmp_path, "stopped first") == {"proc": False, "marker": False}
