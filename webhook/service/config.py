"""The service's configuration file (YAML), validated; every key has an embedded default."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from webhook.adapters import rest_commands
from webhook.adapters.slurm import SlurmCluster
from webhook.adapters.slurmrest import SlurmRest, Token
from webhook.core.patterns import check_argv
from webhook.core.policy import Policy
from webhook.core.validation import describe
from webhook.files import FileError, load_mapping, read_text

log = logging.getLogger("slurmedic.config")


class ConfigError(ValueError):
    """A configuration that does not validate; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Auth(_Strict):
    # The bearer token Alertmanager sends (`authorization: credentials_file`): from a file, or
    # from an environment variable. Basic auth as an alternative (`basic_auth: password_file`).
    bearer_token_file: Path | None = None
    bearer_token_env: str | None = None
    basic_user: str | None = None
    basic_password_file: Path | None = None

    def secrets(self) -> tuple[bytes | None, tuple[bytes, bytes] | None]:
        token = None
        if self.bearer_token_file is not None:
            token = _secret("auth.bearer_token_file", self.bearer_token_file)
        elif self.bearer_token_env:
            value = os.environ.get(self.bearer_token_env, "")
            if not value:
                raise ConfigError(f"auth.bearer_token_env: ${self.bearer_token_env} is empty")
            token = value.encode()
        basic = None
        if self.basic_user and self.basic_password_file is not None:
            password = _secret("auth.basic_password_file", self.basic_password_file)
            basic = (self.basic_user.encode(), password)
        if token is None and basic is None:
            raise ConfigError(
                "auth: give bearer_token_file, bearer_token_env or basic_user + "
                "basic_password_file (the webhook never runs unauthenticated)"
            )
        return token, basic


def _secret(key: str, path: Path) -> bytes:
    try:
        secret = read_text(path, "secret file").strip().encode()
    except FileError as e:
        raise ConfigError(f"{key}: {e}") from e
    if not secret:
        raise ConfigError(f"{key}: {path} is empty")
    if (mode := loose_mode(path)) is not None:
        log.warning("%s: %s is readable by others (mode %04o): chmod 600 it", key, path, mode)
    return secret


def loose_mode(path: Path) -> int | None:
    """A secret file's mode when others than its owner may read it (anyone on the host could
    post alerts, or sign a console session); None when only its owner may."""
    mode = path.stat().st_mode & 0o777
    return mode if mode & 0o077 else None


class SlurmRestConfig(_Strict):
    """slurmrestd, Slurm's REST API (docs/slurmrestd.md): where, as whom, with which JWT."""

    url: str = Field(pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    # The Slurm user the requests act as (X-SLURM-USER-NAME): the token's user.
    user: str = Field(default="slurmedic", pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
    # The JWT: a file the site keeps fresh (a Kubernetes secret, a cron job), or a command
    # printing `SLURM_JWT=...` (`scontrol token lifespan=3600` where scontrol can reach Slurm).
    token_file: Path | None = None
    token_command: list[str] = Field(default=[], max_length=32)
    # The API version (`v0.0.42`); empty: the newest the server serves that slurmedic reads.
    api: str = Field(default="", pattern=r"^(v0\.0\.\d{2})?$")
    # Slurm's topology.conf, for the leaf switches (the REST API does not serve them).
    topology_file: Path | None = None
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)

    @field_validator("token_command")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        return check_argv(argv)

    @model_validator(mode="after")
    def _one_token(self) -> SlurmRestConfig:
        if (self.token_file is None) == (not self.token_command):
            raise ValueError("give one of token_file or token_command")
        return self


class Cluster(_Strict):
    # How slurmedic reads the cluster: `cli`, Slurm's commands on this host (scontrol, sinfo,
    # squeue); `rest`, slurmrestd (`rest:`), for a host with no Slurm commands or munge key.
    slurm: Literal["cli", "rest"] = "cli"
    rest: SlurmRestConfig | None = None
    # Slurm's config for the client commands (squeue/sinfo/scontrol); empty = the default.
    slurm_conf: Path | None = None
    # Where the Slurm commands are when not on PATH (e.g. /opt/slurm/bin); the playbooks that
    # run on this host get it first on their PATH too.
    slurm_bin: Path | None = None
    refresh_seconds: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _rest_given(self) -> Cluster:
        if self.slurm == "rest" and self.rest is None:
            raise ValueError("slurm: rest needs rest: {url, token_file or token_command}")
        return self

    def slurm_env(self) -> dict[str, str]:
        """What the Slurm commands need in their environment (the adapter's, the playbooks')."""
        env = {}
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        if self.slurm_bin is not None:
            env["PATH"] = f"{self.slurm_bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
        return env

    def playbook_env(self) -> dict[str, str]:
        """What the playbooks that act on Slurm run with: the commands' environment, and over
        slurmrestd `scontrol` and `scancel` standing in for Slurm's (adapters/rest_commands.py)
        first on PATH, with the settings they call slurmrestd by. (`slurm_env` stays the real
        commands': a token_command runs the real `scontrol token`.)"""
        env = self.slurm_env()
        if self.slurm != "rest" or self.rest is None:
            return env
        reader = self.reader()
        assert isinstance(reader, SlurmRest)
        path = env.get("PATH", os.environ.get("PATH", os.defpath))
        env["PATH"] = f"{rest_commands.command_dir()}{os.pathsep}{path}"
        env[rest_commands.ENV] = reader.settings()
        return env

    def fit(self, policy: Policy) -> tuple[Policy, str]:
        """The policy as this cluster can carry it out, and what was changed, if anything:
        slurmrestd has no reboot, so over REST a reboot's repair goes to a person."""
        if self.slurm == "rest" and policy.repairs.enabled and policy.repairs.reboot:
            repairs = policy.repairs.model_copy(update={"reboot": False})
            return policy.model_copy(update={"repairs": repairs}), (
                "cluster.slurm is rest and slurmrestd has no reboot: repairs.reboot is taken as "
                "false (what a reboot would mend goes to a person)"
            )
        return policy, ""

    def reader(self) -> SlurmCluster | SlurmRest:
        """The adapter that reads the cluster view, by `slurm`."""
        if self.slurm == "cli" or self.rest is None:
            return SlurmCluster(env=self.slurm_env())
        rest = self.rest
        token = Token(rest.token_file, tuple(rest.token_command), self.slurm_env())
        return SlurmRest(
            rest.url,
            rest.user,
            token,
            api=rest.api,
            topology=rest.topology_file,
            timeout=rest.timeout_seconds,
        )


class Executor(_Strict):
    # Where the playbooks run (the Slurm controller); the repo's inventory/hosts.yml runs them
    # locally. `enabled: false` records decisions without any playbook run, not even dry runs.
    enabled: bool = True
    inventory: Path | None = None
    timeout_seconds: int = Field(default=120, ge=5)
    concurrency: int = Field(default=4, ge=1, le=64)
    retries: int = Field(default=3, ge=1, le=10)
    # After a drain, collect_diagnostics runs on the drained nodes (read-only, in every mode)
    # and its output is kept here, one folder per incident and node.
    diagnostics: bool = True
    artifacts_dir: Path = Path("slurmedic-artifacts")
    # The runs' CPU weight against the service's 100 (cgroup v2's scale): when the CPU is short,
    # in a storm on a small controller, the webhook answers first and the runs wait their turn;
    # when it is not, the runs take what they need. None: the runs compete as equals. Needs a
    # cgroup slurmedic may write: root, or systemd's Delegate=cpu (webhook/executor/cgroup.py).
    cpu_weight: int | None = Field(default=20, ge=1, le=10000)


class Verification(_Strict):
    # Prometheus that scrapes the Pushgateway with the training progress; without it, requeued
    # jobs are not verified (and no recovery figures are recorded).
    prometheus_url: str | None = None
    interval_seconds: float = Field(default=5.0, gt=0)


class Notify(_Strict):
    # The site's Alertmanager: slurmedic posts its notices there (webhook/core/notices.py:
    # approvals waiting, escalations, failed recoveries), routed by `notice="slurmedic"`.
    # None: no notices.
    alertmanager_url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    interval_seconds: float = Field(default=15.0, gt=0)
    # Escalations older than this without a verdict are no longer announced.
    escalation_lookback_hours: float = Field(default=168.0, gt=0)


class Console(_Strict):
    # The review console (/console): its own login, separate from the webhook's token. Users and
    # their roles (viewer, approver, admin) come from `users_file` (YAML: name: {password_hash,
    # role}; `slurmedic console hash` makes a hash), or, behind a reverse proxy that
    # authenticates, from `proxy_user_header`, with roles from `proxy_roles` (default: viewer).
    enabled: bool = False
    users_file: Path | None = None
    proxy_user_header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    proxy_roles: dict[str, Literal["viewer", "approver", "admin"]] = {}
    # Signs the session cookie; the same file for every worker and replica.
    secret_key_file: Path | None = None
    # Where the console is seen from (links in notifications); empty: relative links only.
    public_url: str = ""
    # A dashboard for an incident's job, e.g. Grafana's
    # https://grafana.example/d/slurmedic-job?var-job={job}&var-node={node}; empty: no link.
    dashboard_url: str = ""
    page_size: int = Field(default=50, ge=5, le=500)

    def dashboard_link(self, job: int | None, node: str | None) -> str:
        """The dashboard URL for a job and node (both checked: a job id, a node name)."""
        if not self.dashboard_url:
            return ""
        return self.dashboard_url.replace("{job}", str(job or "")).replace("{node}", node or "")

    def secret_key(self) -> bytes:
        if self.secret_key_file is None:
            raise ConfigError("console.secret_key_file: the console needs a key to sign sessions")
        key = _secret("console.secret_key_file", self.secret_key_file)
        if len(key) < 16:
            path = self.secret_key_file
            raise ConfigError(f"console.secret_key_file: {path} is shorter than 16 bytes")
        return key


class Replicas(_Strict):
    """Several `slurmedic serve` on one PostgreSQL ledger: each stores what it receives, one
    leads (decides and executes) by a lease in the ledger (docs/operations.md: replicas)."""

    # This replica's name in the ledger, /readyz and /metrics; default: host name and pid.
    name: str = Field(default="", pattern=r"^[A-Za-z0-9._:@-]{0,128}$")
    # A leader that stops renewing for this long is replaced: the bound on a takeover, and
    # how long a paused leader's term may still run.
    lease_seconds: float = Field(default=15.0, ge=2, le=600)


class ServiceConfig(_Strict):
    listen: str = "127.0.0.1:8080"  # HOST:PORT, [IPv6]:PORT, or unix:PATH (gunicorn's bind)
    database_url: str = "sqlite:///slurmedic.db"
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    auth: Auth = Auth()
    policy_file: Path | None = None
    cluster: Cluster = Cluster()
    executor: Executor = Executor()
    verification: Verification = Verification()
    console: Console = Console()
    notify: Notify = Notify()
    tick_seconds: float = Field(default=1.0, gt=0)
    replicas: Replicas = Replicas()
    # /metrics reads the ledger at most this often per worker.
    metrics_cache_seconds: float = Field(default=10.0, ge=0)
    workers: int = Field(default=2, ge=1)

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        if v.startswith("unix:"):
            if len(v) == len("unix:"):
                raise ValueError("unix: needs a socket path")
            return v
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isascii() or not port.isdigit():
            raise ValueError(f"{v!r} is not HOST:PORT (e.g. 127.0.0.1:8080)")
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"port {port} is not within 1-65535")
        return v

    def replica_name(self) -> str:
        """This replica's name: the configured one; else the one its `serve` chose (its loop and
        web workers are its children); else the host's name and this process's pid."""
        return (
            self.replicas.name
            or os.environ.get(REPLICA_ENV, "")
            or f"{socket.gethostname()}:{os.getpid()}"
        )


REPLICA_ENV = "SLURMEDIC_REPLICA"


def load_config(path: Path | None) -> ServiceConfig:
    if path is None:
        return ServiceConfig()
    try:
        return ServiceConfig.model_validate(load_mapping(path, "config file"))
    except FileError as e:
        raise ConfigError(str(e)) from e
    except ValidationError as e:
        raise ConfigError(f"{path}: {describe(e)}") from e
