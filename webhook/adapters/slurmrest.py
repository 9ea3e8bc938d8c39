"""The cluster view through slurmrestd, Slurm's REST API: for a service with no `scontrol` and
no munge key on its host (beside Slinky's slurm-operator on Kubernetes, or any site that only
opens the REST API to its tools).

slurmrestd answers with the JSON the clients print (`scontrol show nodes --json`, `sinfo
--json` before 23.02: the same data parser), so the view is read by the same functions as the
CLI's. What differs by release is the API's version in the path: 22.05 serves v0.0.36 to
v0.0.38, 24.11 v0.0.40 to v0.0.42, 26.05 v0.0.42 to v0.0.45. The newest the server lists in its
OpenAPI description is used unless the config names one.

Authentication is Slurm's JWT (`AuthAltTypes=auth/jwt`): the user name and a token in the
headers every request carries. The token is read from a file the site keeps fresh (a
Kubernetes secret, a cron job running `scontrol token`), or made by a command (`scontrol token
lifespan=...`), again when the server refuses it or it is about to expire.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from webhook.adapters.slurm import (
    Release,
    SlurmError,
    SlurmSnapshot,
    parse_topology,
    read_jobs,
    read_nodes,
    run_command,
)
from webhook.core.cluster import ClusterView

TIMEOUT_S = 10.0
# The API versions of Slurm's own plugins (openapi/v0.0.NN, data_parser/v0.0.NN) this adapter
# reads: those of the releases the lab runs and the ones between them.
API = re.compile(r"^/slurm/(v0\.0\.(\d+))/nodes/?$")
KNOWN = range(36, 46)
# A token this close to its expiry is made again before it is used.
EXPIRY_MARGIN_S = 60.0
TOKEN_LINE = re.compile(r"SLURM_JWT=(\S+)")
# How slurmrestd refuses a token: 401/403, and 511 on 24.11 and 26.05 (22.05 answers 500, which
# says nothing of the token).
REFUSED = (401, 403, 511)


@dataclass(frozen=True)
class Token:
    """Where the JWT comes from: a file (read at each use: the site renews it), or a command
    whose output holds `SLURM_JWT=...` (scontrol token), run again when it is about to expire
    or the server refused it."""

    file: Path | None = None
    command: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None


class SlurmRest:
    """The cluster through slurmrestd at `url`, as `user`."""

    def __init__(
        self,
        url: str,
        user: str,
        token: Token,
        *,
        api: str = "",
        topology: Path | None = None,
        timeout: float = TIMEOUT_S,
        session: requests.Session | None = None,
    ) -> None:
        """`topology`: Slurm's topology.conf, for the leaf switches (the REST API has no
        `scontrol show topology`)."""
        self.url = url.rstrip("/")
        self.topology = topology
        self.user = user
        self.token_source = token
        self.timeout = timeout
        self._api = api
        self._session = session or requests.Session()
        self._token: str | None = None
        self._expires = 0.0

    # ---- the token --------------------------------------------------------------------------
    def _current_token(self, *, renew: bool = False) -> str:
        src = self.token_source
        if src.file is not None:
            try:
                text = src.file.read_text().strip()
            except OSError as e:
                raise SlurmError(f"cluster.rest.token_file: {src.file}: {e.strerror}") from e
            token = TOKEN_LINE.search(text)
            value = token[1] if token else text
            if not value:
                raise SlurmError(f"cluster.rest.token_file: {src.file} is empty")
            return value
        if renew or self._token is None or time.time() > self._expires - EXPIRY_MARGIN_S:
            # On top of this process's environment, as the CLI adapter runs Slurm's commands.
            out = run_command(src.command, {**os.environ, **(src.env or {})}, self.timeout)
            found = TOKEN_LINE.search(out)
            if found is None:
                raise SlurmError(
                    f"`{' '.join(src.command)}` (cluster.rest.token_command) printed no "
                    "SLURM_JWT=..."
                )
            self._token = found[1]
            self._expires = expiry(self._token) or time.time() + 3600
        return self._token

    # ---- requests ---------------------------------------------------------------------------
    def get(self, path: str) -> dict[str, Any]:
        """GET `path` as JSON; SlurmError naming the URL and what slurmrestd said."""
        return self.call("GET", path)

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`method` on `path` (with a JSON `body`), its answer as JSON; SlurmError naming the
        call and what slurmrestd said."""
        resp = self._send(method, path, body)
        if resp.status_code in REFUSED and self.token_source.command:
            # Expired early, or revoked: made again once.
            resp = self._send(method, path, body, renew=True)
        return _answer(resp, f"{method} {self.url + path}")

    def _send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        renew: bool = False,
    ) -> requests.Response:
        headers = {
            "X-SLURM-USER-NAME": self.user,
            "X-SLURM-USER-TOKEN": self._current_token(renew=renew),
            "Accept": "application/json",
        }
        try:
            return self._session.request(
                method, self.url + path, headers=headers, json=body, timeout=self.timeout
            )
        except requests.RequestException as e:
            raise SlurmError(f"{method} {self.url + path}: {_short(e)}") from e

    # ---- its settings, for a process of its own (the playbooks' commands over REST) -----------
    def settings(self) -> str:
        """What `from_settings` makes this client again from (JSON; no token in it)."""
        src = self.token_source
        return json.dumps({
            "url": self.url, "user": self.user, "api": self._api, "timeout": self.timeout,
            "token_file": str(src.file) if src.file else "", "token_command": list(src.command),
        })  # fmt: skip

    @classmethod
    def from_settings(cls, text: str, token_env: Mapping[str, str] | None = None) -> SlurmRest:
        """The client `settings` describes; ValueError when `text` is none. `token_env`: what a
        token command runs with."""
        try:
            conf = json.loads(text)
            token = Token(
                Path(conf["token_file"]) if conf["token_file"] else None,
                tuple(conf["token_command"]),
                token_env,
            )
            return cls(conf["url"], conf["user"], token, api=conf["api"],
                       timeout=float(conf["timeout"]))  # fmt: skip
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a slurmrestd client's settings ({e!r})") from e

    def api(self) -> str:
        """The API version to call: the config's, or the newest the server describes."""
        if not self._api:
            paths = self.get("/openapi/v3").get("paths") or {}
            versions = sorted(
                (int(m[2]), m[1]) for p in paths if (m := API.match(p)) and int(m[2]) in KNOWN
            )
            if not versions:
                raise SlurmError(
                    f"{self.url}/openapi/v3: no /slurm/v0.0.NN/nodes this slurmedic reads "
                    f"(v0.0.{KNOWN.start} to v0.0.{KNOWN.stop - 1}); is it slurmrestd?"
                )
            self._api = versions[-1][1]
        return self._api

    # ---- the cluster ------------------------------------------------------------------------
    def snapshot(self) -> SlurmSnapshot:
        api = self.api()
        nodes_path, jobs_path = f"/slurm/{api}/nodes", f"/slurm/{api}/jobs"
        node_data = self.get(nodes_path)
        release = release_of(node_data, self.url + nodes_path)
        nodes = read_nodes(node_data, release, ("GET", nodes_path))
        jobs = read_jobs(self.get(jobs_path), release, ("GET", jobs_path))
        return SlurmSnapshot(release, nodes, jobs, self._switches())

    def _switches(self) -> dict[str, tuple[str, ...]]:
        """The leaf switches of the site's topology.conf; none without one (the shared-cause
        rule then judges only a storm across the cluster)."""
        if self.topology is None:
            return {}
        try:
            text = self.topology.read_text()
        except OSError as e:
            raise SlurmError(f"cluster.rest.topology_file: {self.topology}: {e.strerror}") from e
        try:
            return parse_topology("\n".join(line.split("#", 1)[0] for line in text.splitlines()))
        except ValueError as e:
            raise SlurmError(f"cluster.rest.topology_file: {self.topology}: {e}") from e

    def view(self) -> ClusterView:
        return self.snapshot().view()


def version(api: str) -> int:
    """The number of an API version: `v0.0.42` -> 42."""
    return int(api.rsplit(".", 1)[1])


def release_of(data: Mapping[str, Any], what: str) -> Release:
    """The Slurm release from a response's `meta` (22.05 spells it `Slurm`, later `slurm`)."""
    meta = data.get("meta") or {}
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    text = slurm.get("release") if isinstance(slurm, Mapping) else None
    if not isinstance(text, str):
        version = slurm.get("version") if isinstance(slurm, Mapping) else None
        if isinstance(version, Mapping):
            text = ".".join(str(version.get(k, 0)) for k in ("major", "minor", "micro"))
    if not isinstance(text, str):
        raise SlurmError(f"{what}: no Slurm release in its meta")
    return Release.parse(text)


def expiry(token: str) -> float | None:
    """A JWT's `exp` (Unix seconds), read without checking its signature: only to know when to
    make a new one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    return float(exp) if isinstance(exp, int | float) else None


def _answer(resp: requests.Response, call: str) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        data = None
    errors: Sequence[Any] = data.get("errors") or [] if isinstance(data, dict) else []
    said = next(
        (e.get("description") or e.get("error") for e in errors if isinstance(e, dict)), None
    )
    if resp.status_code >= 400:
        text = said or resp.text.strip()[:200] or resp.reason
        raise SlurmError(f"{call}: HTTP {resp.status_code}: {text}")
    if not isinstance(data, dict):
        raise SlurmError(f"{call}: not a JSON object")
    if said:
        raise SlurmError(f"{call}: {said}")
    return data


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) <= 200 else text[:200] + "..."
