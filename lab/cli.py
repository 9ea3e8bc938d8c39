"""`slurmedic lab ...`: the local lab (a real Slurm cluster and monitoring stack on loopback)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from lab import api, manage, monitoring, postgres, processes, stacks
from lab.config import LabConfig
from lab.faults import SLOW_FACTOR
from lab.slurm import LabError, node_states
from lab.stacks import StackError

F = TypeVar("F", bound=Callable[..., Any])
console = Console()


def lab_errors(fn: F) -> F:
    """Turn lab and validation failures into one-line CLI errors."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (LabError, StackError) as e:
            raise click.ClickException(str(e)) from e
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise click.ClickException(f"{field}: {err['msg']}") from e

    return wrapper  # type: ignore[return-value]


@click.group()
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    envvar="SLURMEDIC_LAB_DIR",
    help="Where the lab keeps its state [default: ./run/lab in the repo; installed from a "
    "wheel, $XDG_STATE_HOME/slurmedic/lab or ~/.local/state/slurmedic/lab].",
)
@click.pass_context
def lab(ctx: click.Context, run_dir: str | None) -> None:
    """The local lab: real Slurm, Prometheus, Alertmanager, Pushgateway, mtail on loopback."""
    try:
        ctx.obj = LabConfig.from_env(run_dir)
    except ValueError as e:
        raise click.ClickException(str(e)) from e


pass_cfg = click.make_pass_decorator(LabConfig)


STACK_OPTION = click.option(
    "--stack",
    type=click.Choice(list(stacks.STACKS)),
    help=f"Debian release whose Slurm and monitoring stack to run [default: "
    f"{stacks.DEFAULT_STACK}, or SLURMEDIC_LAB_STACK, or the stack the lab already runs].",
)


@lab.command()
@STACK_OPTION
@pass_cfg
@lab_errors
def up(cfg: LabConfig, stack: str | None) -> None:
    """Start the lab (harmless when it is already up); builds its stack the first time."""
    if stack is not None:
        cfg = dataclasses.replace(cfg, stack=stack)
    seconds = manage.up(cfg)
    _print_status(cfg)
    console.print(f"lab ready in {seconds:.1f}s  (stack: {cfg.stack}, state: {cfg.run_dir})")


@lab.command()
@click.argument("names", nargs=-1, type=click.Choice(list(stacks.STACKS)))
@lab_errors
def build(names: tuple[str, ...]) -> None:
    """Build the roots of the named stacks (all by default) unless they are built."""
    wanted = [stacks.get(n) for n in names or tuple(stacks.STACKS)]
    # debootstrap waits on the network most of the time: build the roots side by side.
    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        futures = {s.name: pool.submit(stacks.ensure_built, s) for s in wanted}
    for stack in wanted:
        seconds = futures[stack.name].result()
        where = "host packages" if stack.is_host else str(stack.root)
        state = f"built in {seconds:.0f}s" if seconds else "ready"
        console.print(f"{stack.name}: {state} ({where})")


@lab.command("stacks")
@lab_errors
def list_stacks() -> None:
    """The stacks the lab can run, whether each is built, and the versions each carries."""
    table = Table("stack", "what", "built", "slurm", "prometheus", "alertmanager", "mtail")
    for stack in stacks.STACKS.values():
        v = stack.versions()
        table.add_row(
            stack.name + (" (default)" if stack.name == stacks.DEFAULT_STACK else ""),
            stack.description,
            "yes" if stack.built() else "no",
            *(v.get(p, "-") for p in stacks.VERSIONS_COMPONENTS),
        )
    console.print(table)


@lab.command()
@click.option("--purge", is_flag=True, help="Also delete the run directory.")
@pass_cfg
@lab_errors
def down(cfg: LabConfig, purge: bool) -> None:
    """Cancel the lab's jobs and stop every lab process."""
    strays = manage.down(cfg, purge=purge)
    left = manage.running(cfg)
    if strays:
        console.print(f"killed {len(strays)} stray process(es): {strays}")
    if left:
        raise click.ClickException(f"processes still running: {left}")
    console.print("lab is down; nothing left running")


@lab.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_cfg
@lab_errors
def status(cfg: LabConfig, as_json: bool) -> None:
    """Show the lab's processes, nodes and endpoints."""
    if as_json:
        daemons = {d.name: d.pid for d in manage.status(cfg)}
        click.echo(json.dumps({"run_dir": str(cfg.run_dir), "daemons": daemons}))
        return
    _print_status(cfg)


def _print_status(cfg: LabConfig) -> None:
    t = Table(title="slurmedic lab", show_lines=False)
    t.add_column("process")
    t.add_column("pid", justify="right")
    t.add_column("endpoint / state")
    states: dict[str, str] = {}
    if any(d.name == "slurmctld" and d.pid for d in manage.status(cfg)):
        try:
            states = node_states(cfg)
        except LabError:
            states = {}
    endpoints = {
        "prometheus": cfg.prometheus_url,
        "alertmanager": cfg.alertmanager_url,
        "pushgateway": cfg.pushgateway_url,
        "mtail": cfg.url(cfg.mtail_port),
        "slurm-exporter": cfg.url(cfg.slurm_exporter_port),
        "dcgm-exporter": f"127.0.0.1:{cfg.dcgm_port(cfg.nodes[0])}-{cfg.dcgm_port(cfg.nodes[-1])}",
        "slurmctld": f"127.0.0.1:{cfg.slurmctld_port}",
        "mariadb": f"127.0.0.1:{cfg.mariadb_port}",
        "slurmdbd": f"127.0.0.1:{cfg.slurmdbd_port}",
    }
    for d in manage.status(cfg):
        node = d.name.removeprefix("slurmd-")
        detail = states.get(node, "") if d.name.startswith("slurmd-") else endpoints.get(d.name, "")
        pid = str(d.pid) if d.pid else "[red]stopped[/red]"
        t.add_row(d.name, pid, detail)
    # slurmedic itself runs only after `lab serve` (tests start their own).
    served = processes.read_pid(cfg, "slurmedic")
    t.add_row(
        "slurmedic",
        str(served) if served else "[dim]not served (slurmedic lab serve)[/dim]",
        f"{cfg.console_url} (users: {cfg.console_passwords_file})" if served else "",
    )
    console.print(t)


@lab.command()
@click.option("--nodes", "-N", default=4, show_default=True, type=click.IntRange(1, 8))
@click.option("--partition", "-p", default="train", show_default=True)
@click.option("--name", default="pretrain-sim", show_default=True)
@click.option(
    "--steps", type=click.IntRange(1), help="Stop after this many steps [default: run on]."
)
@click.option("--step-time", default=0.5, show_default=True, type=click.FloatRange(0.01))
@click.option("--ckpt-every", default=10, show_default=True, type=click.IntRange(1))
@click.option("--nccl-timeout", default=15.0, show_default=True, type=click.FloatRange(1))
@click.option("--requeue/--no-requeue", default=True, show_default=True)
@click.option("--comment", default="", help="Slurm job comment (e.g. slurmedic opt-in JSON).")
@pass_cfg
@lab_errors
def train(cfg: LabConfig, /, **opts: Any) -> None:
    """Submit a simulated training job (one rank per node); print its job id."""
    click.echo(manage.submit_training(cfg, **opts))


@lab.group()
def inject() -> None:
    """Inject a fault: on a GPU, a node, or a training job's rank."""


def _gpu_fault(kind: str, help_: str, **extra: Any) -> None:
    @inject.command(name=kind.replace("_", "-"), help=help_)
    @click.argument("node")
    @click.option("--gpu", default=0, show_default=True, type=int)
    @pass_cfg
    @lab_errors
    def cmd(cfg: LabConfig, /, node: str, gpu: int, **kw: Any) -> None:
        f = manage.inject_gpu(cfg, kind, node, gpu, **kw)  # type: ignore[arg-type]
        click.echo(
            f"injected {f.kind} on {f.node} gpu {f.gpu}" + (f" (XID {f.xid})" if f.xid else "")
        )

    for opt in reversed(list(extra.values())):
        cmd = opt(cmd)


_gpu_fault(
    "xid",
    "Raise an XID on a GPU (the DCGM gauge then holds its code).",
    code=click.option("--code", "xid", required=True, type=click.IntRange(1, 200)),
)
_gpu_fault(
    "ecc_dbe",
    "Double-bit ECC errors (reported with XID 48).",
    count=click.option("--count", default=1, type=click.IntRange(1)),
)
_gpu_fault("row_remap_failure", "A failed row remap (uncorrectable remapped rows grow).")
_gpu_fault(
    "nvlink",
    "NVLink CRC errors that keep rising.",
    rate=click.option("--rate", default=20.0, type=click.FloatRange(0.01), help="errors/s"),
)
_gpu_fault(
    "pcie",
    "PCIe replays that keep rising.",
    rate=click.option("--rate", default=50.0, type=click.FloatRange(0.01), help="replays/s"),
)
_gpu_fault("thermal", "Sustained thermal violation (hot, clocks throttled).")
_gpu_fault("gpu_lost", "The GPU disappears from the exporter (fell off the bus).")


@inject.command(name="node-down")
@click.argument("node")
@pass_cfg
@lab_errors
def node_down(cfg: LabConfig, node: str) -> None:
    """Kill a node's slurmd (SIGKILL): it stops responding to slurmctld."""
    pid = manage.kill_node(cfg, node)
    click.echo(f"killed slurmd of {node} (pid {pid}); `slurmedic lab clear` brings it back")


def _node_fault(kind: str, help_: str) -> None:
    @inject.command(name=kind.replace("_", "-"), help=help_)
    @click.argument("node")
    @pass_cfg
    @lab_errors
    def cmd(cfg: LabConfig, /, node: str) -> None:
        f = manage.inject_node(cfg, kind, node)  # type: ignore[arg-type]
        click.echo(f"injected {f.kind} on {f.node}; `slurmedic lab clear {f.node}` removes it")


_node_fault("diag_fail", "The node's health check (dcgmi diag) fails, whatever is repaired.")
_node_fault("reboot_hang", "The node's reboots never come back (its RebootProgram does nothing).")


def _job_fault(kind: str, name: str, help_: str) -> None:
    @inject.command(name=name, help=help_)
    @click.argument("job_id", type=int)
    @click.option("--rank", default=0, show_default=True, type=click.IntRange(0))
    @click.option(
        "--factor",
        default=SLOW_FACTOR,
        show_default=True,
        type=click.FloatRange(1.0, min_open=True),
        help="For slow: how many times slower.",
    )
    @pass_cfg
    @lab_errors
    def cmd(cfg: LabConfig, job_id: int, rank: int, factor: float) -> None:
        f = manage.inject_job(cfg, kind, job_id, rank, factor=factor)  # type: ignore[arg-type]
        click.echo(f"injected {f.kind} into job {job_id} rank {f.rank} (attempt {f.attempt})")


_job_fault("hang", "hang", "A rank hangs silently; the others time out in NCCL.")
_job_fault("crash_cuda", "crash-cuda", "A rank dies with a CUDA illegal-memory-access traceback.")
_job_fault("crash_ecc", "crash-ecc", "A rank dies with a CUDA uncorrectable-ECC traceback.")
_job_fault("crash_nccl", "crash-nccl", "A rank dies with the NCCL watchdog timeout lines.")
_job_fault("slow", "slow", "A rank computes --factor times slower (a straggler).")
_job_fault(
    "skip_checkpoints",
    "skip-checkpoints",
    "A rank trains on but writes no more checkpoints (its checkpoint goes stale).",
)
_job_fault(
    "timeout_now",
    "timeout-now",
    "A rank waiting in a collective times out now (its NCCL watchdog fires).",
)


@inject.command(name="spoil-checkpoint")
@click.argument("job_id", type=int)
@click.argument("kind", type=click.Choice(["corrupt", "old"]))
@pass_cfg
@lab_errors
def spoil_checkpoint_cmd(cfg: LabConfig, job_id: int, kind: str) -> None:
    """The job's next attempt resumes from a spoiled checkpoint: corrupt (its step restored,
    its loss back at the start) or old (older than its newest now)."""
    s = manage.spoil_checkpoint(cfg, job_id, kind)  # type: ignore[arg-type]
    click.echo(f"job {job_id}'s attempt {s.attempt} will resume from a {s.kind} checkpoint")


@lab.command(name="dcgm-domain")
@click.argument("domain", default="")
@pass_cfg
@lab_errors
def dcgm_domain_cmd(cfg: LabConfig, domain: str) -> None:
    """dcgm-exporter names its hosts NODE.DOMAIN (as a site's FQDNs); no DOMAIN: Slurm's names."""
    manage.set_dcgm_domain(cfg, domain)
    click.echo(f"dcgm-exporter's hosts: {'NODE.' + domain if domain else 'Slurm node names'}")


@lab.command(name="clear")
@click.argument("node", required=False)
@pass_cfg
@lab_errors
def clear_cmd(cfg: LabConfig, node: str | None) -> None:
    """Undo GPU and node faults (of NODE or all nodes) and restart killed slurmd."""
    if node is not None and node not in cfg.nodes:
        raise click.ClickException(f"node: {node!r} is not a lab node ({cfg.nodes_expr})")
    n = manage.clear(cfg, node)
    click.echo(f"cleared {n} GPU fault(s)")


@lab.command(name="serve")
@click.option(
    "--policy",
    "policy",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="A policy file instead of the lab's (monitor mode), e.g. approve or enforce.",
)
@pass_cfg
@lab_errors
def serve_cmd(cfg: LabConfig, policy: Path | None) -> None:
    """Run `slurmedic serve` against the lab (monitor mode), as a lab process; one already
    served is restarted, on the same ledger, with the policy given now."""
    from lab import monitoring

    if policy is not None:
        from webhook.cli.common import policy_of

        policy_of(policy)  # one line naming the key, before anything starts
    if processes.read_pid(cfg, "slurmedic") is not None:
        processes.stop(cfg, "slurmedic")
        click.echo("slurmedic was served: restarted with this policy")
    monitoring.start_slurmedic(cfg, policy)
    click.echo(
        f"slurmedic serves {cfg.url(cfg.receiver_port)}/api/v1/alerts "
        f"(config {cfg.slurmedic_config}); `slurmedic lab down` stops it\n"
        f"console: {cfg.console_url} (users and passwords: {cfg.console_passwords_file})"
    )


@lab.command(name="postgres")
@click.option(
    "--database",
    default="slurmedic",
    show_default=True,
    help="A database to make afresh (dropped first if it is there).",
)
@pass_cfg
@lab_errors
def postgres_(cfg: LabConfig, database: str) -> None:
    """Start the lab's PostgreSQL (loopback, trust; `lab down` stops it) and print the
    database_url of a fresh database on it: several `slurmedic serve` replicas share it
    (docs/ha.md)."""
    if not database.replace("_", "").isalnum() or not database.isascii():
        raise click.BadParameter("letters, digits and _ only", param_hint="--database")
    postgres.start(cfg)
    click.echo(postgres.new_database(cfg, database))


@lab.command()
@click.option("--nodes", "-N", default=4, show_default=True, type=click.IntRange(2, 6))
@pass_cfg
@lab_errors
def demo(cfg: LabConfig, nodes: int) -> None:
    """Bring the lab up, run a training job, inject a GPU fault and follow it to an alert."""
    from lab import demo as demo_mod

    demo_mod.run(cfg, console, nodes=nodes)


@lab.command(name="trial")
@click.option(
    "--fault",
    "faults",
    multiple=True,
    help="Only these faults (repeatable; default: every one). `--list` names them.",
)
@click.option("--list", "list_only", is_flag=True, help="List the faults and exit.")
@pass_cfg
@lab_errors
def trial_cmd(cfg: LabConfig, faults: tuple[str, ...], list_only: bool) -> None:
    """Run a trial of every injectable fault against the served slurmedic (`lab serve`), one
    training job each, and list what it recommended: judge them in the console."""
    from lab import trial

    known = {f.name: f for f in trial.FAULTS}
    if list_only:
        for f in trial.FAULTS:
            click.echo(f"{f.name:12} {f.what}")
        return
    unknown = [f for f in faults if f not in known]
    if unknown:
        raise click.ClickException(f"--fault: {unknown[0]!r} is not one of {', '.join(known)}")
    if processes.read_pid(cfg, "slurmedic") is None:
        raise click.ClickException("slurmedic is not served: `slurmedic lab serve` first")

    def show(o: trial.Outcome) -> None:
        made = "; ".join(
            f"#{r.id} {r.action} {','.join(r.nodes or r.exclude)} ({r.cause}"
            + (f", guard {r.guard}" if r.guard else "")
            + ")"
            for r in o.decisions
        )
        console.print(f"{o.fault.name:12} job {o.job} on {o.node}: {made or 'no decision'}")

    outcomes = trial.run(cfg, list(faults) or None, progress=show)
    judged = sum(len(o.decisions) for o in outcomes)
    console.print(
        f"{len(outcomes)} faults, {judged} decisions: judge them at {cfg.console_url}, then "
        f"`slurmedic trial report --config {cfg.slurmedic_config}`"
    )


@lab.command()
@click.argument("layout", type=click.Choice(["split", "join"]))
@pass_cfg
@lab_errors
def shards(cfg: LabConfig, layout: str) -> None:
    """Split the rules between a Prometheus per leaf switch and a global ruler, or join them
    back into one Prometheus (docs/rule-scale.md)."""
    if layout == "split":
        monitoring.split(cfg)
        for switch in cfg.switches:
            port = cfg.prometheus_shard_port(switch.name)
            click.echo(f"shard {switch.name} ({switch.nodes}): {cfg.url(port)}")
        click.echo(f"global ruler: {cfg.prometheus_url}")
    else:
        monitoring.join(cfg)
        click.echo(f"one Prometheus again: {cfg.prometheus_url}")


@lab.command()
@click.argument("promql")
@pass_cfg
@lab_errors
def query(cfg: LabConfig, promql: str) -> None:
    """Ask the lab's Prometheus (instant query) and print the result as JSON lines."""
    for sample in api.query(cfg, promql):
        click.echo(json.dumps(sample))


@lab.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("stack_name", metavar="STACK", type=click.Choice(list(stacks.STACKS)))
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@lab_errors
def exec_cmd(stack_name: str, argv: tuple[str, ...]) -> None:
    """Run one of a stack's commands (promtool, amtool, mtail, sinfo, ...) here, e.g.
    `slurmedic lab exec sid promtool test rules alert_rules/tests/*.test.yml`."""
    stack = stacks.get(stack_name)
    if stack.is_host:
        os.execvp(argv[0], list(argv))  # noqa: S606 - the operator's own command line
    stacks.ensure_built(stack)
    # A run directory of its own (the wrappers bind it): the command sees the repo and the
    # temporary directory (a test's files), not a lab.
    tmp = Path(tempfile.gettempdir())
    bindir = stacks.write_wrappers(stack, stack.exec_dir(), (tmp,))
    assert bindir is not None
    if not (bindir / argv[0]).exists():
        raise click.ClickException(f"{argv[0]} is not one of the {stack.name} stack's commands")
    os.execv(bindir / argv[0], list(argv))  # noqa: S606 - the operator's own command line
