"""The lab's RebootProgram: `scontrol reboot` of a lab node restarts its slurmd as a rebooted
node's, with the GPU faults a reboot clears gone.

slurmd runs RebootProgram for its node (22.05 and 24.11 through system() with slurmd's own
environment, 26.05 directly with only SLURM_NODE_NAME set) and the reboot kills that slurmd, so
the work is done by a detached grandchild while the program itself returns at once.

slurmctld counts a reboot as done only when the node registers with a boot time after the
reboot was asked for (boot time = now - the uptime slurmd reports; node_mgr.c of 22.05 to 26.05).
Every lab slurmd shares one host and its uptime, so the restarted slurmd runs with `-b`, slurmd's
own testing flag ("report node rebooted when daemon restarted"): its uptime counts from its start.
A node with `reboot_hang` injected never comes back: slurmctld marks it DOWN after ResumeTimeout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from lab import processes, slurm, stacks
from lab.config import LabConfig
from lab.faults import load_gpu_faults, repair_gpu_faults

DOWN_SECONDS = 1.0  # how long a rebooting node stays silent before its slurmd starts again


def slurmd_of(pid: int) -> tuple[int, str] | None:
    """The slurmd among `pid` and its ancestors, and the node it runs (its `-N`)."""
    current: int | None = pid
    while current is not None and current > 1:
        argv = cmdline(current)
        if argv and Path(argv[0]).name == "slurmd" and "-N" in argv[:-1]:
            return current, argv[argv.index("-N") + 1]
        current = processes.parent_of(current)
    return None


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def reboot(cfg: LabConfig, node: str, slurmd_pid: int, log: Path) -> None:
    """Stop the node's slurmd, clear what a reboot clears, start it again as freshly booted."""
    _, node_faults = load_gpu_faults(cfg.faults_file).of_node(node)
    if "reboot_hang" in node_faults:
        _log(log, f"{node}: reboot_hang injected; the node does not come back")
        return
    _log(log, f"{node}: stopping slurmd (pid {slurmd_pid})")
    processes.stop_pid(slurmd_pid)
    (cfg.pids / f"slurmd-{node}.pid").unlink(missing_ok=True)
    time.sleep(DOWN_SECONDS)
    cleared = repair_gpu_faults(cfg.faults_file, node, "reboot")
    _log(log, f"{node}: cleared {len(cleared)} GPU fault(s); starting slurmd -b")
    slurm.start_slurmd(cfg, node, rebooted=True)


def _log(log: Path, line: str) -> None:
    with log.open("a") as out:
        out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def _detach() -> bool:
    """Fork twice; True in the grandchild (a session of its own, outside slurmd's group), False
    in the caller, which returns to slurmd at once."""
    if os.fork():
        os.wait()
        return False
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # slurmd 26.05 reads the program's output until every copy closes
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="RebootProgram (slurmedic lab)")
    parser.add_argument("--lab-dir", required=True)
    parser.add_argument("features", nargs="*", help="ignored: node features to boot with")
    args = parser.parse_args(argv)
    cfg = LabConfig.from_env(args.lab_dir)
    found = slurmd_of(os.getpid())
    if found is None:
        print(
            "RebootProgram: not run by a lab slurmd (no `slurmd -N NODE` above it)", file=sys.stderr
        )
        return 1
    slurmd_pid, node = found
    if not stacks.get(cfg.stack).is_host:
        # Already inside the stack's root, as slurmd was: its slurmd is started from here.
        os.environ[stacks.IN_STACK_ENV] = cfg.stack
    for name in [n for n in os.environ if n.startswith("SLURMD_")]:
        # 24.11+: what a reconfigured slurmd hands its re-exec'd self (its listening socket's
        # fd, its boot time); the rebooted slurmd must start afresh.
        del os.environ[name]
    caller = os.getpid()
    if _detach():
        try:
            # slurmd waits for its RebootProgram: stopping slurmd's process group before the
            # program has returned would kill it too (system() "returned 15").
            processes.wait_until(lambda: not processes.is_alive(caller), 10.0)
            reboot(cfg, node, slurmd_pid, cfg.logs / f"reboot-{node}.log")
        finally:
            os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
