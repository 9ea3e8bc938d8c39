"""The service's configuration file (YAML), validated; every key has an embedded default."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from webhook.core.policy import describe


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
            token = self.bearer_token_file.read_text().strip().encode()
            if not token:
                raise ConfigError(f"auth.bearer_token_file: {self.bearer_token_file} is empty")
        elif self.bearer_token_env:
            value = os.environ.get(self.bearer_token_env, "")
            if not value:
                raise ConfigError(f"auth.bearer_token_env: ${self.bearer_token_env} is empty")
            token = value.encode()
        basic = None
        if self.basic_user and self.basic_password_file is not None:
            password = self.basic_password_file.read_text().strip().encode()
            if not password:
                raise ConfigError(f"auth.basic_password_file: {self.basic_password_file} is empty")
            basic = (self.basic_user.encode(), password)
        if token is None and basic is None:
            raise ConfigError(
                "auth: give bearer_token_file, bearer_token_env or basic_user + "
                "basic_password_file (the webhook never runs unauthenticated)"
            )
        return token, basic


class Cluster(_Strict):
    # Slurm's config for the client commands (squeue/sinfo/scontrol); empty = the default.
    slurm_conf: Path | None = None
    # Where the Slurm commands are when not on PATH (e.g. /opt/slurm/bin); the playbooks that
    # run on this host get it first on their PATH too.
    slurm_bin: Path | None = None
    refresh_seconds: float = Field(default=5.0, gt=0)

    def slurm_env(self) -> dict[str, str]:
        """What the Slurm commands need in their environment (the adapter's, the playbooks')."""
        env = {}
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        if self.slurm_bin is not None:
            env["PATH"] = f"{self.slurm_bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
        return env


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


class Verification(_Strict):
    # Prometheus that scrapes the Pushgateway with the training progress; without it, requeued
    # jobs are not verified (and no recovery figures are recorded).
    prometheus_url: str | None = None
    interval_seconds: float = Field(default=5.0, gt=0)


class ServiceConfig(_Strict):
    listen: str = "127.0.0.1:8080"
    database_url: str = "sqlite:///slurmedic.db"
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    auth: Auth = Auth()
    policy_file: Path | None = None
    cluster: Cluster = Cluster()
    executor: Executor = Executor()
    verification: Verification = Verification()
    tick_seconds: float = Field(default=1.0, gt=0)
    # /metrics reads the ledger at most this often per worker.
    metrics_cache_seconds: float = Field(default=10.0, ge=0)
    workers: int = Field(default=2, ge=1)


def load_config(path: Path | None) -> ServiceConfig:
    if path is None:
        return ServiceConfig()
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return ServiceConfig.model_validate(data)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML ({str(e).splitlines()[0]})") from e
    except ValidationError as e:
        raise ConfigError(f"{path}: {describe(e)}") from e
