"""Build the wheels, install them where no checkout is in sight, and run slurmedic from there.

What CI asks of a release: a wheel of slurmedic (and of the job-side reporter it depends on)
installed into a bare venv outside the repo, with its dependencies from the package index, can
show its help, replay a scenario, render the rules into a directory it is given, serve (monitor
mode, the embedded defaults, an Alertmanager payload accepted), run a shipped playbook in check
mode, and bring the lab up and down. And the reporter, installed alone into a venv with nothing
else and no index, pushes what docs/progress.md says to a stand-in Pushgateway.

    .venv/bin/python scripts/wheel_check.py [--keep] [--no-lab]

Everything it starts it stops, by PID, and its temporary directory goes, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "tests" / "scenarios" / "attr-gpu-hw-double-bit-ecc.yaml"
PAYLOAD = REPO / "tests" / "data" / "alertmanager" / "real-payload-firing.json"
LAB_PORT_BASE = "30000"  # above the lab test jobs' ports (scripts/test.sh), which it runs beside
TOKEN = "wheel-check-token"  # noqa: S105 - the throwaway server's token, not a secret


class CheckFailed(Exception):
    pass


def step(title: str) -> None:
    print(f"-- {title}", flush=True)


def check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


def run(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if out.returncode != 0:
        raise CheckFailed(
            f"{' '.join(argv)} exited {out.returncode}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
        )
    return out


def export_tree(dest: Path) -> None:
    """The checkout's files as git sees them (committed or not, ignored ones left out), links
    kept as links: a build from here sees no stale build/ or .venv of the working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src, dst = REPO / name, dest / name
        if not src.is_symlink() and not src.exists():
            continue  # deleted in the working tree, not yet in the index
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(src.readlink())
        else:
            shutil.copy2(src, dst)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: bytes | None = None, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, headers=headers)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return int(e.code), bytes(e.read())


def wait_for(
    what: str, ready: Callable[[], bool], alive: Callable[[], bool], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check(alive(), f"{what} exited before it was ready")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.2)  # polling an endpoint that is not up yet
    raise CheckFailed(f"{what} not ready after {timeout:.0f}s")


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def check_serve(slurmedic: str, work: Path, env: dict[str, str]) -> None:
    step("slurmedic serve (embedded defaults but a free port and a token; monitor mode)")
    port = free_port()
    config = work / "serve.yml"
    # Nothing but where to listen and how Alertmanager authenticates: the rest is embedded.
    config.write_text(
        json.dumps({"listen": f"127.0.0.1:{port}", "auth": {"bearer_token_env": "CHECK_TOKEN"}})
    )
    log = (work / "serve.out").open("wb")
    proc = subprocess.Popen(
        [slurmedic, "serve", f"--config={config}"],
        cwd=work,
        env={**env, "CHECK_TOKEN": TOKEN},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def loop_runs() -> bool:
        # No Slurm here: its loop runs and says so, not ready (a site's is, once it reads one).
        status, answer = http(f"{url}/readyz")
        said = json.loads(answer).get("reason", "") if status == 503 else ""
        return status == 200 or said.startswith("the loop has not read the cluster from Slurm")

    try:
        wait_for("slurmedic serve", loop_runs, lambda: proc.poll() is None, 60)
        print(f"   /readyz: {http(f'{url}/readyz')[1].decode()[:300]}")
        body = PAYLOAD.read_bytes()
        status, _ = http(f"{url}/api/v1/alerts", body)
        check(status == 401, f"an unauthenticated POST got {status}, not 401")
        status, answer = http(f"{url}/api/v1/alerts", body, TOKEN)
        check(status == 200, f"the Alertmanager payload got {status}: {answer[:300]!r}")
        accepted = json.loads(answer)
        print(f"   payload accepted: {accepted}")
        check(Path(work / "slurmedic.db").is_file(), "no ledger (slurmedic.db) in the work dir")
    except CheckFailed:
        stop_group(proc)
        print((work / "serve.out").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        stop_group(proc)
        log.close()


def check_lab(slurmedic: str, python: str, work: Path, env: dict[str, str]) -> None:
    step(f"slurmedic lab up / status / down (port base {LAB_PORT_BASE})")
    lab_dir = work / "lab"
    lab_env = {**env, "SLURMEDIC_LAB_DIR": str(lab_dir), "SLURMEDIC_LAB_PORT_BASE": LAB_PORT_BASE}
    try:
        up = " ".join(
            run([slurmedic, "lab", "up"], cwd=work, env=lab_env, timeout=900).stdout.split()
        )
        ready = re.search(r"lab ready in \S+", up)
        check(ready is not None, f"`lab up` said: {up[-500:]}")
        print(f"   {ready.group(0) if ready else ''}")
        listed = run([slurmedic, "lab", "status", "--json"], cwd=work, env=lab_env).stdout
        status = json.loads(listed)
        down = [name for name, pid in status["daemons"].items() if pid is None]
        check(not down, f"lab daemons not running after `lab up`: {down}")
        check((lab_dir / "rules" / "gpu.rules.yml").is_file(), "the lab rendered no rules")
        step("a shipped playbook, in check mode, against the lab's Slurm")
        code = (
            "import json, sys\n"
            "from lab.config import LabConfig\n"
            "from webhook.executor.runner import run_playbook\n"
            "cfg = LabConfig.from_env()\n"
            "r = run_playbook('drain_nodes', {'slurmedic_nodes': ['gpu01'],\n"
            "    'slurmedic_reason': 'slurmedic: wheel check', 'slurmedic_slurm_env':\n"
            "    cfg.slurm_env()}, check=True)\n"
            "print(json.dumps(r.summary()))\n"
        )
        result = json.loads(run([python, "-c", code], cwd=work, env=lab_env).stdout)
        check(result["status"] == "successful", f"drain_nodes (check mode): {result}")
        check(
            any("drain" in c for c in result["commands"]),
            f"drain_nodes would run no drain: {result['commands']}",
        )
        print(f"   would run: {result['commands']}")
        step("a simulated training job on the lab reports its progress (slurmedic_progress)")
        job = run(
            [slurmedic, "lab", "train", "--nodes=2", "--steps=3", "--step-time=0.2"],
            cwd=work,
            env=lab_env,
        ).stdout.strip()
        gateway = f"http://127.0.0.1:{int(LAB_PORT_BASE) + 91}/metrics"
        series = re.compile(r"^training_step\{([^}]*)\} ([0-9.e+]+)$", re.M)

        def ranks_stepped() -> set[str]:
            text = http(gateway)[1].decode()
            return {
                labels
                for labels, value in series.findall(text)
                if f'slurm_job_id="{job}"' in labels and float(value) >= 1
            }

        wait_for(
            f"job {job}'s progress at the lab's Pushgateway",
            lambda: len(ranks_stepped()) == 2,
            lambda: True,
            120,
        )
        print(f"   job {job}: steps pushed from every rank's slurmedic_progress")
    finally:
        downed = subprocess.run(
            [slurmedic, "lab", "down"], cwd=work, env=lab_env, capture_output=True, text=True
        )
        said = (downed.stdout.strip() or downed.stderr.strip()).splitlines()
        print("   " + (said[-1] if said else f"`lab down` exited {downed.returncode}"))
    check(downed.returncode == 0, f"lab down failed: {downed.stderr[-2000:]}")


# Run by the reporter's own venv: a stand-in Pushgateway records what the documented usage
# pushes. Standard library only, like the reporter.
REPORTER_USAGE = r"""
import json, os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

pushes = []

class Gateway(BaseHTTPRequestHandler):
    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        pushes.append({"path": self.path, "body": body})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ.update({
    "SLURMEDIC_PUSHGATEWAY": f"http://127.0.0.1:{server.server_address[1]}",
    "SLURM_JOB_ID": "4242", "SLURM_PROCID": "1", "SLURMD_NODENAME": "gpu03",
    "SLURM_RESTART_COUNT": "0",
})

from slurmedic_progress import ProgressReporter

progress = ProgressReporter.from_env()
progress.flush()  # pushes go from a thread of their own; flush waits for each here
progress.step(1, 0.25)
progress.flush()
progress.checkpoint(1)
progress.close()  # the last push sent, the thread gone
server.shutdown()
try:
    import webhook
except ImportError:
    service = False
else:
    service = True
print(json.dumps({"pushes": pushes, "failed": progress.failed_pushes, "service": service}))
"""


def check_reporter(dist: Path, tmp: Path, work: Path) -> None:
    step("the reporter alone: a bare venv, no index, nothing else installed")
    venv = tmp / "reporter-venv"
    env = bare_env()
    run([sys.executable, "-m", "venv", str(venv)], cwd=work, env=env)
    pip = str(venv / "bin" / "pip")
    (wheel,) = dist.glob("slurmedic_progress-*.whl")
    run([pip, "install", "-q", "--no-index", "--no-deps", str(wheel)], cwd=work, env=env)
    listed = json.loads(run([pip, "list", "--format=json"], cwd=work, env=env).stdout)
    names = {p["name"].lower() for p in listed} - {"pip", "setuptools"}
    check(names == {"slurmedic-progress"}, f"the reporter's venv holds {sorted(names)}")
    out = run([str(venv / "bin" / "python"), "-c", REPORTER_USAGE], cwd=work, env=env)
    seen = json.loads(out.stdout)
    check(not seen["service"], "the reporter's venv can import slurmedic's service")
    check(seen["failed"] == 0, f"{seen['failed']} pushes failed")
    paths = {p["path"] for p in seen["pushes"]}
    check(
        paths == {"/metrics/job/training/slurm_job_id/4242/rank/1"} and len(seen["pushes"]) == 3,
        f"pushes: {seen['pushes']}",
    )
    last = seen["pushes"][-1]["body"]
    for series in ('training_step{node="gpu03"} 1.0', "training_last_checkpoint_step{"):
        check(series in last, f"the last push lacks {series}: {last}")
    print(f"   3 pushes to {paths.pop()}")


def bare_env(venv: Path | None = None) -> dict[str, str]:
    """The environment without the checkout's traces (PYTHONPATH, an active venv)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("SLURMEDIC_LAB_DIR", None)
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--no-lab", action="store_true", help="skip `lab up` (no Slurm here)")
    args = p.parse_args(argv)
    # A CI job that is cancelled gets SIGTERM: unwind, so that the cleanup below still runs.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="slurmedic-wheel-check-"))
    try:
        work = tmp / "work"  # the operator's directory: no checkout above it
        work.mkdir()
        step("build the wheels from a clean copy of the tree")
        src, dist = tmp / "src", tmp / "dist"
        export_tree(src)
        pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist)]
        run([*pip_wheel, str(src), str(src / "reporter")], cwd=work)
        wheels = sorted(dist.glob("*.whl"))
        print("   " + ", ".join(w.name for w in wheels))
        check_reporter(dist, tmp, work)

        step("install slurmedic's wheel into a bare venv, dependencies from the index")
        venv = tmp / "venv"
        run([sys.executable, "-m", "venv", str(venv)], cwd=work)
        env = bare_env(venv)
        python, slurmedic = str(venv / "bin" / "python"), str(venv / "bin" / "slurmedic")
        run([python, "-m", "pip", "install", "-q", *map(str, wheels)], cwd=work, env=env)
        where = run(
            [python, "-c", "import webhook.resources as r; print(r.ROOT, r.checkout())"],
            cwd=work,
            env=env,
        ).stdout.split()
        check(
            Path(where[0]).is_relative_to(venv) and where[1] == "None",
            f"resources from {where}, not the venv",
        )

        step("slurmedic --help, --version")
        out = run([slurmedic, "--help"], cwd=work, env=env).stdout
        check(all(c in out for c in ("serve", "replay", "rules", "lab", "doctor")), out)
        version = run([slurmedic, "--version"], cwd=work, env=env).stdout.strip()
        wanted = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
        check(wanted is not None and version == f"slurmedic, version {wanted[1]}", version)

        step("slurmedic files export DIR: what the checkout ships, runbooks and examples too")
        exported = work / "site"
        run([slurmedic, "files", "export", str(exported)], cwd=work, env=env)
        for folder, source in (
            ("runbooks", REPO / "docs" / "runbooks"),
            ("examples", REPO / "examples"),
            ("playbooks", REPO / "playbooks"),
            ("alert_rules/mtail", REPO / "alert_rules" / "mtail"),
        ):
            want = sorted(p.name for p in source.iterdir() if p.is_file())
            got = sorted(p.name for p in (exported / folder).iterdir() if p.is_file())
            check(got == want, f"{folder}: the wheel exported {got}, the checkout has {want}")

        step(f"slurmedic replay {SCENARIO.name} --json (as from the checkout)")
        shutil.copy(SCENARIO, work / SCENARIO.name)
        replayed = json.loads(
            run([slurmedic, "replay", SCENARIO.name, "--json"], cwd=work, env=env).stdout
        )
        from_checkout = json.loads(
            run(
                [sys.executable, "-m", "webhook.cli", "replay", str(SCENARIO), "--json"], cwd=REPO
            ).stdout
        )
        check(replayed == from_checkout, f"replay differs: {replayed} != {from_checkout}")

        step("slurmedic rules render --out DIR / rules check")
        refused = subprocess.run(
            [slurmedic, "rules", "render"], cwd=work, env=env, capture_output=True, text=True
        )
        check(
            refused.returncode == 2 and "--out" in refused.stderr,
            f"`rules render` without --out from a wheel: {refused.returncode} {refused.stderr}",
        )
        rendered = work / "rules"
        run([slurmedic, "rules", "render", "--out", str(rendered)], cwd=work, env=env)
        names = sorted(p.name for p in rendered.glob("*.rules.yml"))
        shipped = sorted(p.name for p in (REPO / "alert_rules").glob("*.rules.yml"))
        check(names == shipped, f"rendered {names}, the repo has {shipped}")
        for name in names:
            same = (rendered / name).read_text() == (REPO / "alert_rules" / name).read_text()
            check(same, f"{name} rendered from the wheel differs from alert_rules/{name}")
        run([slurmedic, "rules", "check"], cwd=work, env=env)
        print(f"   {len(names)} rule files, identical to alert_rules/")

        check_serve(slurmedic, work, env)
        if not args.no_lab:
            check_lab(slurmedic, python, work, env)
        print("wheel check: all passed")
        return 0
    except (CheckFailed, subprocess.TimeoutExpired) as e:
        print(f"wheel check FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
