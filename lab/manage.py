"""`slurmedic lab up | down | status`, job submission and fault injection, as functions."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

import hostlist

from lab import accounting, monitoring, person, postgres, processes, slurm, slurmrestd, stacks
from lab.config import CODE_ROOT, LabConfig
from lab.faults import (
    SLOW_FACTOR,
    GpuFault,
    GpuFaultKind,
    JobFault,
    JobFaultKind,
    NodeFault,
    NodeFaultKind,
    Spoiled,
    SpoilKind,
    add_gpu_fault,
    add_job_fault,
    add_node_fault,
    add_spoiled,
    clear_gpu_faults,
    control_path,
)
from lab.slurm import LabError
from webhook.adapters.slurm import expand

MONITORING = (
    "slurm-exporter",
    "dcgm-exporter",
    "mtail",
    "pushgateway",
    "alertmanager",
    "prometheus",
)


@dataclass
class Daemon:
    name: str
    pid: int | None


def daemons(cfg: LabConfig) -> list[str]:
    """The lab's daemons in the order they start."""
    db = ["mariadb", "slurmdbd"] if cfg.accounting else []
    return [
        "munged",
        *db,
        "slurmctld",
        *(f"slurmd-{n}" for n in cfg.nodes),
        "slurmrestd",
        *reversed(MONITORING),
    ]


def daemon_ports(cfg: LabConfig) -> dict[str, list[int]]:
    return {
        "slurmctld": [cfg.slurmctld_port],
        **{f"slurmd-{n}": [cfg.slurmd_port(n)] for n in cfg.nodes},
        "slurmrestd": [cfg.slurmrestd_port],
        "prometheus": [cfg.prometheus_port],
        "alertmanager": [cfg.alertmanager_port, cfg.alertmanager_gossip_port],
        "pushgateway": [cfg.pushgateway_port],
        "mtail": [cfg.mtail_port],
        "dcgm-exporter": [cfg.dcgm_port(n) for n in cfg.nodes],
        "slurm-exporter": [cfg.slurm_exporter_port],
        **(
            {"mariadb": [cfg.mariadb_port], "slurmdbd": [cfg.slurmdbd_port]}
            if cfg.accounting
            else {}
        ),
    }


def check_ports(cfg: LabConfig) -> None:
    """Fail fast, naming the port, when a daemon to start would find its port taken."""
    for name, ports in daemon_ports(cfg).items():
        if processes.read_pid(cfg, name) is not None:
            continue
        taken = [p for p in ports if processes.port_in_use(p)]
        if taken:
            raise LabError(
                f"port {taken[0]} for {name} is in use (another lab? set SLURMEDIC_LAB_PORT_BASE)"
            )


def running_stack(cfg: LabConfig) -> str | None:
    """The stack the lab in this run directory was brought up with, while anything runs."""
    return _running_setting(cfg, "stack")


def _running_setting(cfg: LabConfig, name: str) -> str | None:
    """A setting the lab in this run directory was brought up with (`etc/<name>`), while
    anything runs."""
    try:
        value = (cfg.etc / name).read_text().strip()
    except OSError:
        return None
    return value if any(d.pid for d in status(cfg)) else None


def prepare_stack(cfg: LabConfig) -> float:
    """Build the lab's stack if it is not built (cached outside the repo) and write its
    command wrappers; return the build's seconds (0 when cached)."""
    stack = stacks.get(cfg.stack)
    other = running_stack(cfg)
    if other is not None and other != cfg.stack:
        raise LabError(
            f"the lab in {cfg.run_dir} runs the {other} stack; `slurmedic lab down` first"
        )
    acct = "1" if cfg.accounting else "0"
    if _running_setting(cfg, "accounting") not in (None, acct):
        raise LabError(
            f"the lab in {cfg.run_dir} runs with SLURMEDIC_LAB_ACCOUNTING="
            f"{'0' if cfg.accounting else '1'}; `slurmedic lab down` first"
        )
    built = stacks.ensure_built(stack)
    stacks.write_wrappers(stack, cfg.run_dir)
    # The person tests act as, in the root too before slurmctld resolves its uid.
    person.ensure(cfg)
    cfg.etc.mkdir(parents=True, exist_ok=True)
    (cfg.etc / "stack").write_text(cfg.stack + "\n")
    (cfg.etc / "accounting").write_text(acct + "\n")
    return built


def start_accounting(cfg: LabConfig) -> None:
    """MariaDB and slurmdbd with the cluster and the lab's operator registered, unless the lab
    runs without accounting."""
    if not cfg.accounting:
        return
    accounting.start(cfg)
    accounting.add_operator(cfg, person.PERSON)


def up(cfg: LabConfig) -> float:
    """Bring the whole lab up (harmless when it is up); return the seconds it took."""
    t0 = time.monotonic()
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    prepare_stack(cfg)
    check_ports(cfg)
    slurm.start_cluster(cfg, before_controller=lambda: start_accounting(cfg))
    slurmrestd.start(cfg)
    monitoring.start(cfg)
    slurm.wait_nodes_ready(cfg)
    monitoring.wait_ready(cfg)
    monitoring.wait_scraped(cfg)
    return time.monotonic() - t0


def down(cfg: LabConfig, *, purge: bool = False) -> list[int]:
    """Stop everything; return the PIDs that had to be killed as strays (should be none)."""
    # slurmctld may already be gone; the sweep below still finds job tasks.
    with contextlib.suppress(LabError, OSError):
        slurm.cancel_all_jobs(cfg)
    # slurmedic (while `lab serve`, a test or a bench runs it) first: it acts on the rest.
    for name in ("slurmedic", *MONITORING):
        processes.stop(cfg, name)
    processes.stop(cfg, "slurmrestd")
    for node in cfg.nodes:
        processes.stop(cfg, f"slurmd-{node}", grace=3.0)
    processes.stop(cfg, "slurmctld")
    # After slurmctld, which sends slurmdbd what it still holds as it stops; whether or not
    # this config asks for accounting (the lab may have been brought up otherwise).
    accounting.stop(cfg)
    processes.stop(cfg, "munged")
    # Whatever else a test or a bench started as a lab daemon (a second slurmedic replica,
    # PostgreSQL for their shared ledger).
    for pidfile in sorted(cfg.pids.glob("*.pid")) if cfg.pids.is_dir() else []:
        processes.stop(cfg, pidfile.stem)
    strays = list(processes.marked_pids(cfg))
    for pid in strays:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    processes.wait_until(lambda: not any(processes.is_alive(p) for p in strays), 5.0)
    if purge and cfg.run_dir.exists():
        shutil.rmtree(cfg.run_dir)
    if purge:
        shutil.rmtree(postgres.data_dir(cfg), ignore_errors=True)
    return strays


def status(cfg: LabConfig) -> list[Daemon]:
    return [Daemon(name, processes.read_pid(cfg, name)) for name in daemons(cfg)]


def running(cfg: LabConfig) -> list[int]:
    """Every live process of this lab, by PID file or by environment marker."""
    pids = {d.pid for d in status(cfg) if d.pid is not None}
    return sorted(pids | set(processes.marked_pids(cfg)))


# ---- training jobs ---------------------------------------------------------------------------


def submit_training(
    cfg: LabConfig,
    *,
    nodes: int = 4,
    partition: str = "train",
    name: str = "pretrain-sim",
    steps: int | None = None,
    step_time: float = 0.5,
    ckpt_every: int = 10,
    nccl_timeout: float = 15.0,
    requeue: bool = True,
    comment: str = "",
    exclude: str = "",
    expedite: bool = False,
) -> int:
    """`expedite`: `--requeue=expedite` (Slurm 25.11 and later): Slurm requeues the job itself
    when a node or an epilog fails, and holds it when it exits non-zero."""
    trainer = [
        cfg.python,
        "-m",
        "lab.trainer",
        f"--step-time={step_time}",
        f"--ckpt-every={ckpt_every}",
        f"--nccl-timeout={nccl_timeout}",
    ]
    if steps is not None:
        trainer.append(f"--steps={steps}")
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        f"--partition={partition}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--exclusive",
        "--gres=gpu:8",
        ("--requeue=expedite" if expedite else "--requeue") if requeue else "--no-requeue",
        f"--output={cfg.jobs}/slurm-%j.out",
        f"--chdir={CODE_ROOT}",
        f"--wrap=srun {shlex.join(trainer)}",
    ]
    if comment:
        argv.append(f"--comment={comment}")
    if exclude:
        argv.append(f"--exclude={exclude}")
    cfg.jobs.mkdir(parents=True, exist_ok=True)
    out = slurm.slurm(cfg, *argv).strip()
    return int(out.split(";")[0])


def show_job(cfg: LabConfig, job_id: int) -> dict[str, str]:
    """`scontrol show job -o` as a dict (22.05 has no --json for scontrol)."""
    out = slurm.slurm(cfg, "scontrol", "show", "job", "-o", str(job_id), check=False)
    fields: dict[str, str] = {}
    for token in out.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    if "JobId" not in fields:
        raise LabError(f"job {job_id} is not known to the lab's slurmctld")
    return fields


def running_job(cfg: LabConfig, job_id: int) -> tuple[list[str], int]:
    """The nodes and restart count of a RUNNING job, or a clear error."""
    info = show_job(cfg, job_id)
    if info.get("JobState") != "RUNNING":
        raise LabError(f"job {job_id} is {info.get('JobState')}, not RUNNING")
    return list(expand(info.get("NodeList", ""))), int(info.get("Restarts", "0"))


# ---- faults --------------------------------------------------------------------------------


def inject_gpu(
    cfg: LabConfig,
    kind: GpuFaultKind,
    node: str,
    gpu: int,
    *,
    xid: int | None = None,
    count: int = 1,
    rate: float = 1.0,
) -> GpuFault:
    if node not in cfg.nodes:
        raise LabError(f"node: {node!r} is not a lab node ({cfg.nodes_expr})")
    if not 0 <= gpu < cfg.gpus_per_node:
        raise LabError(f"gpu: {gpu} is not in 0..{cfg.gpus_per_node - 1}")
    fault = GpuFault(node=node, gpu=gpu, kind=kind, at=time.time(), xid=xid, count=count, rate=rate)
    add_gpu_fault(cfg.faults_file, fault)
    return fault


def inject_node(cfg: LabConfig, kind: NodeFaultKind, node: str) -> NodeFault:
    if node not in cfg.nodes:
        raise LabError(f"node: {node!r} is not a lab node ({cfg.nodes_expr})")
    fault = NodeFault(node=node, kind=kind, at=time.time())
    add_node_fault(cfg.faults_file, fault)
    return fault


def drain_as(cfg: LabConfig, user: str, nodes: str | Sequence[str], reason: str) -> None:
    """Drain `nodes` (a host list or names) as `user` would by hand: `scontrol update` under
    that user's uid (lab/person.py), so accounting records that user with the reason."""
    _update_nodes_as(cfg, user, nodes, "state=drain", f"reason={reason}")


def resume_as(cfg: LabConfig, user: str, nodes: str | Sequence[str]) -> None:
    """Resume `nodes` as `user` (the end of its drain event in accounting)."""
    _update_nodes_as(cfg, user, nodes, "state=resume")


def _update_nodes_as(cfg: LabConfig, user: str, nodes: str | Sequence[str], *what: str) -> None:
    names = list(hostlist.expand_hostlist(nodes)) if isinstance(nodes, str) else list(nodes)
    unknown = [n for n in names if n not in cfg.nodes]
    if not names or unknown:
        raise LabError(f"nodes: {unknown or nodes!r} not lab nodes ({cfg.nodes_expr})")
    nodelist = hostlist.collect_hostlist(names)
    person.run_as(cfg, user, "scontrol", "update", f"nodename={nodelist}", *what)


def kill_node(cfg: LabConfig, node: str) -> int:
    """Kill a node as if it lost power: its slurmd and everything it runs, with SIGKILL."""
    if node not in cfg.nodes:
        raise LabError(f"node: {node!r} is not a lab node ({cfg.nodes_expr})")
    pid = processes.read_pid(cfg, f"slurmd-{node}")
    if pid is None:
        raise LabError(f"slurmd of {node} is not running")
    victims = [pid, *processes.descendants(pid)]
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    processes.wait_until(lambda: not any(processes.is_alive(v) for v in victims), 5.0)
    return pid


def inject_job(
    cfg: LabConfig,
    kind: JobFaultKind,
    job_id: int,
    rank: int,
    *more: int,
    factor: float = SLOW_FACTOR,
) -> JobFault:
    """The fault on `rank` (and on `more` ranks, written at once: ranks that fail alike, none
    torn down by another's exit before it reads its own fault)."""
    nodes, attempt = running_job(cfg, job_id)
    for r in (rank, *more):
        if not 0 <= r < len(nodes):
            raise LabError(f"rank: job {job_id} has ranks 0..{len(nodes) - 1}, not {r}")
    now = time.time()
    faults = [
        JobFault(rank=r, attempt=attempt, kind=kind, at=now, factor=factor) for r in (rank, *more)
    ]
    add_job_fault(control_path(cfg.jobs, job_id), *faults)
    return faults[0]


def spoil_checkpoint(cfg: LabConfig, job_id: int, kind: SpoilKind) -> Spoiled:
    """The running job's next attempt resumes from a spoiled checkpoint (lab/faults.py)."""
    _, attempt = running_job(cfg, job_id)
    # `old`: older than the newest checkpoint the job has written so far (its shards say),
    # which slurmedic will have seen by the time the job fails.
    written = [
        int(step)
        for shard in (cfg.jobs / str(job_id) / "ckpt").glob("rank*.json")
        for step, _ in json.loads(shard.read_text()).get("kept", [])
    ]
    before = max(written, default=0) if kind == "old" else None
    spoiled = Spoiled(attempt=attempt + 1, kind=kind, before=before)
    add_spoiled(control_path(cfg.jobs, job_id), spoiled)
    return spoiled


def set_dcgm_domain(cfg: LabConfig, domain: str) -> None:
    """The fake dcgm-exporter names its hosts `NODE.DOMAIN` from its next scrape ('' : Slurm's
    names again), as a site's exporters that report fully qualified names do."""
    if domain and not re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*", domain):
        raise LabError(f"domain: {domain!r} is not a DNS domain")
    cfg.dcgm_domain_file.parent.mkdir(parents=True, exist_ok=True)
    cfg.dcgm_domain_file.write_text(domain + "\n" if domain else "")


def clear(cfg: LabConfig, node: str | None = None) -> int:
    """Undo GPU faults (of one node or all) and restart killed slurmd; return faults removed."""
    removed = clear_gpu_faults(cfg.faults_file, node)
    for n in cfg.nodes if node is None else [node]:
        if processes.read_pid(cfg, "slurmctld") is not None:
            slurm.start_slurmd(cfg, n)
    return removed
