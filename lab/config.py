"""Where the lab lives and which loopback ports it takes.

Everything derives from two settings, so a second lab (the test suite's) can run beside a
developer's without a clash: the run directory (`SLURMEDIC_LAB_DIR`) and the port base
(`SLURMEDIC_LAB_PORT_BASE`).
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hostlist

from webhook import resources

# Where the `lab` and `webhook` packages are: the checkout, or site-packages for a wheel.
CODE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PORT_BASE = 17000

# The environment variable every lab process carries: `lab down` finds strays by it.
MARKER_ENV = "SLURMEDIC_LAB_DIR"


def _default_stack() -> str:
    from lab.stacks import DEFAULT_STACK, STACK_ENV

    return os.environ.get(STACK_ENV) or DEFAULT_STACK


# Slurm accounting (slurmdbd on MariaDB) runs in the lab unless this says 0: a real site has it,
# and what slurmedic reads of a job's history (sacct) and of people's actions (sacctmgr show
# event) exists only with it.
ACCOUNTING_ENV = "SLURMEDIC_LAB_ACCOUNTING"


def _accounting_from(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError(f"{ACCOUNTING_ENV} must be 1 (on, the default) or 0 (off), not {raw!r}")
    return raw == "1"


def _default_accounting() -> bool:
    return _accounting_from(os.environ.get(ACCOUNTING_ENV) or "1")


# How the lab's slurmedic reaches Slurm (its config's cluster.slurm): `cli`, Slurm's commands;
# `rest`, slurmrestd alone, with a token the lab makes at `up` (as beside Slinky).
SLURM_ENV = "SLURMEDIC_LAB_SLURM"
TRANSPORTS = ("cli", "rest")


def _default_transport() -> str:
    raw = os.environ.get(SLURM_ENV) or "cli"
    if raw not in TRANSPORTS:
        raise ValueError(f"{SLURM_ENV} must be cli (the default) or rest, not {raw!r}")
    return raw


def default_run_dir() -> Path:
    """`run/lab` in a checkout; for an installed slurmedic, the user's state directory (its
    own package directory is no place for a lab's state)."""
    checkout = resources.checkout()
    if checkout is not None:
        return checkout / "run" / "lab"
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "slurmedic" / "lab"


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: str
    default: bool = False


@dataclass(frozen=True)
class Switch:
    name: str
    nodes: str


@dataclass(frozen=True)
class LabConfig:
    run_dir: Path
    port_base: int = DEFAULT_PORT_BASE
    nodes_expr: str = "gpu[01-08]"
    gpus_per_node: int = 8
    cpus_per_node: int = 8
    memory_mb: int = 16000
    partitions: tuple[Partition, ...] = (
        Partition("train", "gpu[01-06]", default=True),
        Partition("debug", "gpu[07-08]"),
    )
    switches: tuple[Switch, ...] = (Switch("leaf1", "gpu[01-04]"), Switch("leaf2", "gpu[05-08]"))
    # dcgm-exporter renamed its host label from `Hostname` to `hostname` in mid-2026.
    dcgm_host_label: str = "Hostname"
    scrape_interval: str = "1s"
    # Rules every 2 s: the GPU groups' closed windows cost a tenth of a second of Prometheus'
    # CPU an evaluation even on the lab's 64 GPUs; every 2 s halves what that takes from the
    # labs that run side by side, and an alert fires at most a second later.
    evaluation_interval: str = "2s"
    # Which Debian release's Slurm and monitoring stack the lab runs (lab/stacks.py).
    # SLURMEDIC_LAB_STACK, else lab/stacks.py's default (tests and benches follow the env too).
    stack: str = field(default_factory=lambda: _default_stack())
    python: str = field(default_factory=lambda: sys.executable)
    # slurmdbd and its MariaDB (lab/accounting.py); SLURMEDIC_LAB_ACCOUNTING=0 turns them off.
    accounting: bool = field(default_factory=_default_accounting)
    # SLURMEDIC_LAB_SLURM: how the lab's slurmedic reads and acts on Slurm (cli or rest).
    slurm_transport: str = field(default_factory=_default_transport)
    # slurmedic's playbook runs in a cgroup that gives way under contention (executor.cpu_weight,
    # the product's default). False: they compete as equals. The lab tests say False: on a host
    # without CPU accounting (cgroup v1's root, as in CI) the runs give way to every process on
    # it, and CI runs two stacks' labs at once on two cores, a contention no site has (a second
    # cluster on its controller) that held a dry run back past any bound. What the weight does
    # is tested on its own, on this host's real cgroups (tests/service/test_run_cgroup.py).
    weigh_runs: bool = True

    def __post_init__(self) -> None:
        # The lab takes base+1 .. base+917 (with 8 leaf switches, the most it has room for);
        # above 32767 the kernel hands out ephemeral ports,
        # and a client's source port could take one of ours. Checked here, for every lab (the
        # tests and benches make theirs without the environment).
        if not 1024 <= self.port_base <= 31000:
            raise ValueError(
                f"the lab's port base (SLURMEDIC_LAB_PORT_BASE) must be from 1024 to 31000, "
                f"not {self.port_base}"
            )
        if len(self.switches) > 8:
            raise ValueError("the lab has room for 8 leaf switches (a shard port each)")
        from lab.stacks import get

        get(self.stack)  # a clear error for an unknown name

    @classmethod
    def from_env(cls, run_dir: Path | str | None = None) -> LabConfig:
        rd = run_dir or os.environ.get(MARKER_ENV) or default_run_dir()
        raw_base = os.environ.get("SLURMEDIC_LAB_PORT_BASE", str(DEFAULT_PORT_BASE))
        if not raw_base.isdigit():
            raise ValueError(
                f"SLURMEDIC_LAB_PORT_BASE must be a number from 1024 to 31000, not {raw_base!r}"
            )
        base = int(raw_base)
        host_label = os.environ.get("SLURMEDIC_LAB_DCGM_HOST_LABEL", "Hostname")
        if host_label not in ("Hostname", "hostname"):
            raise ValueError(
                f"SLURMEDIC_LAB_DCGM_HOST_LABEL must be Hostname or hostname, not {host_label!r}"
            )
        from lab.stacks import STACK_ENV

        # The stack named, else the one this run directory's lab was brought up with.
        recorded = Path(rd) / "etc" / "stack"
        stack = os.environ.get(STACK_ENV) or (
            recorded.read_text().strip() if recorded.is_file() else _default_stack()
        )
        # Accounting likewise: named, else as this run directory's lab was brought up.
        recorded_acct = Path(rd) / "etc" / "accounting"
        raw_acct = os.environ.get(ACCOUNTING_ENV) or (
            recorded_acct.read_text().strip() if recorded_acct.is_file() else "1"
        )
        accounting = _accounting_from(raw_acct)
        return cls(
            run_dir=Path(rd).resolve(),
            port_base=base,
            dcgm_host_label=host_label,
            stack=stack,
            accounting=accounting,
        )

    # ---- nodes -------------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return list(hostlist.expand_hostlist(self.nodes_expr))

    def partition_of(self, node: str) -> str:
        for p in self.partitions:
            if node in hostlist.expand_hostlist(p.nodes):
                return p.name
        raise KeyError(node)

    # ---- ports (all on 127.0.0.1) ------------------------------------------------------
    @property
    def slurmctld_port(self) -> int:
        return self.port_base + 817

    def slurmd_port(self, node: str) -> int:
        return self.port_base + 1 + self.nodes.index(node)

    @property
    def prometheus_port(self) -> int:
        return self.port_base + 90

    @property
    def pushgateway_port(self) -> int:
        return self.port_base + 91

    @property
    def alertmanager_port(self) -> int:
        return self.port_base + 93

    @property
    def alertmanager_gossip_port(self) -> int:
        """The lab's Alertmanager's cluster (gossip) port: a second Alertmanager peers with it."""
        return self.port_base + 94

    @property
    def alertmanager_peer_port(self) -> int:
        """The second Alertmanager's web port (started by the HA tests, `monitoring.add_peer`)."""
        return self.port_base + 95

    @property
    def alertmanager_peer_gossip_port(self) -> int:
        return self.port_base + 96

    @property
    def mtail_port(self) -> int:
        return self.port_base + 903

    @property
    def slurm_exporter_port(self) -> int:
        return self.port_base + 341

    def dcgm_port(self, node: str) -> int:
        return self.port_base + 401 + self.nodes.index(node)

    def prometheus_shard_port(self, switch: str) -> int:
        """A scrape shard's Prometheus (`monitoring.split`): one per leaf switch, up to 8."""
        return self.port_base + 910 + [s.name for s in self.switches].index(switch)

    @property
    def postgres_port(self) -> int:
        """The lab's PostgreSQL (lab/postgres.py), for the replica tests' shared ledger."""
        return self.port_base + 432

    @property
    def mariadb_port(self) -> int:
        """The lab's MariaDB (lab/accounting.py): slurmdbd's database."""
        return self.port_base + 306

    @property
    def slurmdbd_port(self) -> int:
        return self.port_base + 819

    @property
    def slurmrestd_port(self) -> int:
        """slurmrestd, Slurm's REST API (JWT auth), as Slinky and REST-only sites reach Slurm."""
        return self.port_base + 820

    @property
    def slurmrestd_url(self) -> str:
        return self.url(self.slurmrestd_port)

    @property
    def slurmrestd_token_file(self) -> Path:
        """A JWT for root, made at `up` (`scontrol token`), as a site's renewal job keeps one."""
        return self.etc / "slurmrestd.jwt"

    @property
    def jwt_key(self) -> Path:
        """The key slurmctld signs and checks JWTs with (AuthAltParameters=jwt_key)."""
        return self.run_dir / "slurm" / "jwt_hs256.key"

    @property
    def receiver_port(self) -> int:
        """Where the lab's Alertmanager sends notifications (slurmedic, or a test receiver)."""
        return self.port_base + 500

    def url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    @property
    def prometheus_url(self) -> str:
        return self.url(self.prometheus_port)

    @property
    def alertmanager_url(self) -> str:
        return self.url(self.alertmanager_port)

    @property
    def pushgateway_url(self) -> str:
        return self.url(self.pushgateway_port)

    # ---- paths -------------------------------------------------------------------------
    @property
    def etc(self) -> Path:
        return self.run_dir / "etc"

    @property
    def logs(self) -> Path:
        return self.run_dir / "log"

    @property
    def pids(self) -> Path:
        return self.run_dir / "pid"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.run_dir / "munge" / "munge.socket"

    @property
    def joblogs(self) -> Path:
        """The directory mtail tails: srun writes one file per job, node and rank here."""
        return self.run_dir / "joblogs"

    @property
    def jobs(self) -> Path:
        """Per-job working state of the training simulator (progress, checkpoints, control)."""
        return self.run_dir / "jobs"

    @property
    def dcgm_domain_file(self) -> Path:
        """The domain the fake dcgm-exporter adds to its host label, when it holds one
        (`slurmedic lab dcgm-domain`): a site whose exporters name hosts by their FQDN."""
        return self.etc / "dcgm-domain"

    @property
    def faults_file(self) -> Path:
        return self.run_dir / "dcgm" / "faults.json"

    @property
    def webhook_token_file(self) -> Path:
        """The bearer token Alertmanager sends to the webhook (and slurmedic expects)."""
        return self.etc / "webhook.token"

    @property
    def slurmedic_config(self) -> Path:
        return self.etc / "slurmedic.yml"

    @property
    def console_users_file(self) -> Path:
        """The console's users (password hashes): admin, approver and viewer."""
        return self.etc / "console-users.yml"

    @property
    def console_passwords_file(self) -> Path:
        """Their passwords, in clear, for whoever runs the lab (0600)."""
        return self.etc / "console-passwords.yml"

    @property
    def console_url(self) -> str:
        return f"{self.url(self.receiver_port)}/console/"

    @property
    def hostname(self) -> str:
        return socket.gethostname()

    def slurm_env(self) -> dict[str, str]:
        """What a Slurm command needs to reach this lab's cluster (slurmedic's cluster config
        says the same: `cluster.slurm_conf`, `cluster.slurm_bin`)."""
        env = self.env()
        return {k: env[k] for k in ("SLURM_CONF", "PATH")}

    def env(self) -> dict[str, str]:
        """The environment for every lab process and every Slurm client call."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        env[MARKER_ENV] = str(self.run_dir)
        env["SLURMEDIC_LAB_PORT_BASE"] = str(self.port_base)
        env["SLURMEDIC_LAB_DCGM_HOST_LABEL"] = self.dcgm_host_label
        env["PYTHONUNBUFFERED"] = "1"
        env["SLURMEDIC_LAB_STACK"] = self.stack
        env[ACCOUNTING_ENV] = "1" if self.accounting else "0"
        from lab.stacks import get

        if not get(self.stack).is_host:
            # The stack's Slurm and monitoring commands: wrappers that run them in its root.
            env["PATH"] = f"{self.bindir}{os.pathsep}{env.get('PATH', os.defpath)}"
        return env

    @property
    def bindir(self) -> Path:
        """Wrappers for the commands of a stack other than the host's (lab/stacks.py)."""
        return self.run_dir / "bin"
