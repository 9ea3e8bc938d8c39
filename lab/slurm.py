"""A real Slurm cluster on one machine (22.05 to 26.05, by the lab's stack): munged, slurmctld
and one `slurmd -N` per node.

Settings follow what is known to work here (docs/lab.md): root everywhere, fake GPU
gres backed by character devices, short scheduler and timeout intervals so failures show in
seconds rather than minutes.
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import hostlist

from lab import processes, stacks
from lab.config import LabConfig

SLURM_TIMEOUT = 20.0
RESUME_TIMEOUT = 60  # seconds
CLUSTER = "slurmedic-lab"  # ClusterName, and the cluster's name in the accounting database


class LabError(RuntimeError):
    """The lab could not be brought into the asked state; the message says why."""


def slurm(cfg: LabConfig, *args: str, check: bool = True, timeout: float = SLURM_TIMEOUT) -> str:
    """Run a Slurm client command against the lab cluster and return its stdout."""
    proc = subprocess.run(
        list(args), env=cfg.env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


# ---- configuration -------------------------------------------------------------------------


def render_slurm_conf(cfg: LabConfig) -> str:
    rd = cfg.run_dir
    nodes = cfg.nodes
    first, last = cfg.slurmd_port(nodes[0]), cfg.slurmd_port(nodes[-1])
    lines = [
        "# Written by `slurmedic lab up`; edits are overwritten.",
        f"ClusterName={CLUSTER}",
        f"SlurmctldHost={cfg.hostname}(127.0.0.1)",
        f"SlurmctldPort={cfg.slurmctld_port}",
        f"SlurmdPort={first}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={cfg.munge_socket},cred_expire=5",
        # JWTs for slurmrestd's clients (`scontrol token`), beside munge for everything else.
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={cfg.jwt_key}",
        f"StateSaveLocation={rd}/slurm/state",
        f"SlurmdSpoolDir={rd}/slurm/spool/%n",
        f"SlurmctldPidFile={rd}/slurm/slurmctld.pid",
        f"SlurmdPidFile={rd}/slurm/slurmd-%n.pid",
        f"SlurmctldLogFile={cfg.logs}/slurmctld.log",
        f"SlurmdLogFile={cfg.logs}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1,sched_interval=1",
        "GresTypes=gpu",
        "TopologyPlugin=topology/tree",
        # A node that was down only for not answering returns when its slurmd does (a killed
        # slurmd, restarted); one set down on purpose stays down: slurmedic's reboot
        # (nextstate=DOWN) keeps the node out of service until its health check passes,
        # which ReturnToService=2 would not (docs/repairs.md).
        "ReturnToService=1",
        "SlurmdParameters=config_overrides",
        *accounting_lines(cfg),
        "JobCompType=jobcomp/none",
        # A killed slurmd shows as not responding within seconds, DOWN after SlurmdTimeout.
        "SlurmdTimeout=10",
        "SlurmctldTimeout=10",
        "MessageTimeout=5",
        "KillWait=2",
        "InactiveLimit=0",
        "MinJobAge=300",
        # `scontrol reboot` runs the lab's reboot (lab/reboot.py): a few seconds. A reboot that
        # has not come back within ResumeTimeout leaves the node DOWN ("reboot timed out").
        f"RebootProgram={reboot_program(cfg)}",
        f"ResumeTimeout={RESUME_TIMEOUT}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"NodeName={cfg.nodes_expr} NodeHostname={cfg.hostname} NodeAddr=127.0.0.1 "
        f"Port=[{first}-{last}] CPUs={cfg.cpus_per_node} RealMemory={cfg.memory_mb} "
        f"Gres=gpu:{cfg.gpus_per_node} State=UNKNOWN",
    ]
    if stacks.get(cfg.stack).slurm_metrics:
        # slurmctld's own metrics on its port (/metrics/nodes, /jobs, ...), which the lab's
        # Prometheus scrapes beside the exporter's.
        lines.append("MetricsType=metrics/openmetrics")
    if stacks.get(cfg.stack).expedited_requeue:
        # A `--requeue=expedite` job is requeued by Slurm itself, at once and first in line,
        # when a node or an epilog fails, and held when it exits non-zero (docs/operations.md).
        lines.append("SlurmctldParameters=enable_expedited_requeue")
    for p in cfg.partitions:
        lines.append(
            f"PartitionName={p.name} Nodes={p.nodes} Default={'YES' if p.default else 'NO'} "
            "MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"


def reboot_program(cfg: LabConfig) -> Path:
    """slurmd runs RebootProgram by path (26.05 without an environment): a script of the run
    directory, which every stack's root sees at the same path."""
    return cfg.run_dir / "slurm" / "reboot"


def render_reboot_program(cfg: LabConfig) -> str:
    argv = [cfg.python, "-m", "lab.reboot", f"--lab-dir={cfg.run_dir}"]
    return (
        "#!/bin/sh\n# Written by `slurmedic lab up`: the lab nodes' RebootProgram.\n"
        f'exec {shlex.join(argv)} "$@"\n'
    )


def accounting_lines(cfg: LabConfig) -> list[str]:
    """slurmdbd (lab/accounting.py) keeps every job attempt and node event, with the GPUs each
    job held; without it (SLURMEDIC_LAB_ACCOUNTING=0) Slurm keeps nothing past MinJobAge."""
    if not cfg.accounting:
        return [
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
        ]
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={cfg.slurmdbd_port}",
        # The munge socket for slurmdbd connections (AuthInfo's is not used for them).
        f"AccountingStoragePass={cfg.munge_socket}",
        "AccountingStorageTRES=gres/gpu",
        # Steps' usage from /proc, as a site without cgroups gathers it (the lab's roots run
        # without a cgroup plugin).
        "JobAcctGatherType=jobacct_gather/linux",
    ]


def render_gres_conf(cfg: LabConfig) -> str:
    last = cfg.gpus_per_node - 1
    return (
        "AutoDetect=off\n"
        f"NodeName={cfg.nodes_expr} Name=gpu File={cfg.run_dir}/dev/nvidia[0-{last}]\n"
    )


def render_topology_conf(cfg: LabConfig) -> str:
    leaves = [f"SwitchName={s.name} Nodes={s.nodes}" for s in cfg.switches]
    names = hostlist.collect_hostlist([s.name for s in cfg.switches])
    return "\n".join([*leaves, f"SwitchName=spine Switches={names}"]) + "\n"


def write_config(cfg: LabConfig) -> None:
    for d in (cfg.etc, cfg.logs, cfg.run_dir / "slurm" / "state", cfg.run_dir / "dev"):
        d.mkdir(parents=True, exist_ok=True)
    for node in cfg.nodes:
        (cfg.run_dir / "slurm" / "spool" / node).mkdir(parents=True, exist_ok=True)
    for i in range(cfg.gpus_per_node):
        dev = cfg.run_dir / "dev" / f"nvidia{i}"
        if not dev.exists():
            # gres needs real device nodes; regular files make the nodes INVAL.
            subprocess.run(["mknod", str(dev), "c", "1", "3"], check=True)
    _write_if_changed(cfg.slurm_conf, render_slurm_conf(cfg))
    _write_if_changed(reboot_program(cfg), render_reboot_program(cfg))
    reboot_program(cfg).chmod(0o755)
    _write_if_changed(cfg.etc / "gres.conf", render_gres_conf(cfg))
    _write_if_changed(cfg.etc / "topology.conf", render_topology_conf(cfg))
    cgroup = cfg.etc / "cgroup.conf"
    if stacks.get(cfg.stack).cgroup_disabled:
        # slurmd 24.11+ cannot initialise a cgroup plugin inside the stack's root; 22.05
        # rejects `disabled`, and runs without the file.
        _write_if_changed(cgroup, "CgroupPlugin=disabled\n")
    else:
        cgroup.unlink(missing_ok=True)


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# ---- daemons -------------------------------------------------------------------------------


def start_munge(cfg: LabConfig) -> None:
    mdir = cfg.munge_socket.parent
    mdir.mkdir(parents=True, exist_ok=True)
    mdir.chmod(0o755)
    key = mdir / "munge.key"
    if not key.exists():
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
        key.chmod(0o600)
    processes.start(
        cfg,
        "munged",
        [
            "munged",
            "--foreground",
            "--force",
            f"--socket={cfg.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={mdir / 'munged.pid'}",
            f"--log-file={cfg.logs / 'munged.log'}",
            f"--seed-file={mdir / 'munged.seed'}",
        ],
    )
    if not processes.wait_until(cfg.munge_socket.exists, 10):
        raise LabError(f"munged did not create {cfg.munge_socket}; see {cfg.logs}/munged.out")


def start_slurmctld(cfg: LabConfig) -> None:
    processes.start(cfg, "slurmctld", ["slurmctld", "-D", "-i", "-f", str(cfg.slurm_conf)])
    if not processes.wait_until(lambda: "UP" in slurm(cfg, "scontrol", "ping"), 15, 0.2):
        raise LabError(f"slurmctld did not answer; see {cfg.logs}/slurmctld.log")


def write_jwt_key(cfg: LabConfig) -> None:
    """The JWT signing key slurmctld reads at its start: random, SlurmUser's (root's) alone."""
    if not cfg.jwt_key.exists():
        cfg.jwt_key.parent.mkdir(parents=True, exist_ok=True)
        cfg.jwt_key.write_bytes(secrets.token_bytes(64))
        cfg.jwt_key.chmod(0o600)


def start_slurmd(cfg: LabConfig, node: str, *, rebooted: bool = False) -> None:
    """`rebooted`: the node reports it booted when its slurmd started (slurmd -b), which
    slurmctld needs to see before it counts a reboot as done (lab/reboot.py)."""
    flags = ["-b"] if rebooted else []
    argv = ["slurmd", *flags, "-D", "-N", node, "-f", str(cfg.slurm_conf)]
    processes.start(cfg, f"slurmd-{node}", argv)


def start_cluster(cfg: LabConfig, *, before_controller: Callable[[], None] | None = None) -> None:
    """munged, slurmctld and every slurmd; `before_controller` runs once munge does (slurmdbd
    authenticates through it, and must be up for slurmctld's first records)."""
    path = cfg.env()["PATH"]
    tools = ["munged", "slurmctld", "slurmd", "slurmrestd", "sinfo"]
    if cfg.accounting:
        tools += ["slurmdbd", "sacctmgr"]
    for tool in tools:
        if shutil.which(tool, path=path) is None:
            raise LabError(f"{tool} is not installed: run ./scripts/setup.sh first")
    write_config(cfg)
    write_jwt_key(cfg)
    start_munge(cfg)
    if before_controller is not None:
        before_controller()
    start_slurmctld(cfg)
    for node in cfg.nodes:
        start_slurmd(cfg, node)


def node_states(cfg: LabConfig) -> dict[str, str]:
    """Node name to a compact state: idle, alloc, mixed, down, drain, ... plus `*` if silent."""
    out = slurm(cfg, "sinfo", "-h", "-N", "-o", "%N %t")
    states: dict[str, str] = {}
    for line in out.splitlines():
        name, state = line.split()
        states[name] = state
    return states


def wait_nodes_ready(cfg: LabConfig, timeout: float = 20.0) -> None:
    """Wait until every node has registered (no `*`, not unknown/down)."""

    def ready() -> bool:
        states = node_states(cfg)
        return len(states) == len(cfg.nodes) and all(
            not s.endswith("*") and s.rstrip("$~#!%@^-") not in ("unk", "down", "inval")
            for s in states.values()
        )

    if not processes.wait_until(ready, timeout, 0.2):
        raise LabError(f"nodes not ready after {timeout:.0f}s: {node_states(cfg)}")


def cancel_all_jobs(cfg: LabConfig, timeout: float = 15.0) -> None:
    """scancel every job and wait for them to leave (killing slurmd would orphan job tasks)."""
    if processes.read_pid(cfg, "slurmctld") is None:
        return
    slurm(cfg, "scancel", "--full", "--user=root", check=False)
    processes.wait_until(
        lambda: not slurm(cfg, "squeue", "-h", "-t", "R,CG,PD,S", "-o", "%i", check=False).strip(),
        timeout,
        0.3,
    )
