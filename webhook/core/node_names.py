"""Host names as alerts spell them, and the Slurm node names they stand for.

dcgm-exporter's `hostname`, a scrape target's `instance` and a site's relabelling often give a
host's fully qualified name (`gpu017.cluster.example.org`) where Slurm knows `gpu017`, or a
management name (`gpu017-bmc`). The policy's `node_names` says how to read them; the webhook,
replay, the backtest and the simulator all read alerts through it (webhook.core.evidence).

A name that is itself a node of the cluster is always that node: a mapping only applies to
names Slurm does not know, so a site whose Slurm names are fully qualified loses nothing by
setting `strip_domain`. A name that still matches no node is never acted on, and never dropped
in silence: the engine tallies it (Engine.take_unmatched) and `hint` says what would match.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

NO_HOSTS: Mapping[str, str] = {}  # no node runs on a machine of another name
# `\1`, `\g<1>`, `\g<name>`: the group references re's templates take.
_GROUP_REF = re.compile(r"\\(?:g<([^>]*)>|([0-9]{1,2}))")


class Rewrite(BaseModel):
    """`match` (a regular expression the whole host name must match) becomes `replace` (its
    template: `\\1` or `\\g<name>` for a group)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: str
    replace: str

    @field_validator("match")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a regular expression: {e}") from None
        return v

    @model_validator(mode="after")
    def _groups_exist(self) -> Rewrite:
        pattern = re.compile(self.match)
        for name, number in _GROUP_REF.findall(self.replace):
            ref = name or number
            known = int(ref) <= pattern.groups if ref.isdigit() else ref in pattern.groupindex
            if not known:
                raise ValueError(f"replace: names group {ref!r}, which match does not have")
        return self

    def apply(self, host: str) -> str | None:
        m = re.fullmatch(self.match, host)
        return m.expand(self.replace) if m else None


class NodeNames(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # gpu017.cluster.example.org -> gpu017 (never an IP address's digits).
    strip_domain: bool = False
    # Tried in order, after strip_domain; the first that matches rewrites the name.
    rewrite: list[Rewrite] = []

    def candidate(self, host: str) -> str:
        """The node name `host` stands for under this mapping (itself, when nothing applies)."""
        name = host
        if self.strip_domain and "." in name and not _is_address(name):
            name = name.split(".", 1)[0]
        for rule in self.rewrite:
            if (rewritten := rule.apply(name)) is not None:
                return rewritten
        return name

    def resolve(
        self, host: str, nodes: Container[str], hosts: Mapping[str, str] = NO_HOSTS
    ) -> str | None:
        """The node of the cluster `host` names: itself, else its mapped name, else the node
        that runs on that machine (`hosts`, ClusterView.hosts: a Slinky pod's Kubernetes
        node); None when none is a node."""
        if host in nodes:
            return host
        name = self.candidate(host)
        if name in nodes:
            return name
        return hosts.get(host) or hosts.get(name)

    def hint(self, host: str, nodes: Container[str]) -> str:
        """What would make `host` match a node, when a simple setting would ('' otherwise)."""
        short = host.split(".", 1)[0]
        if not self.strip_domain and short != host and short in nodes and not _is_address(host):
            return f"its short name {short} is a node: set node_names.strip_domain"
        return ""


@dataclass
class Unmatched:
    """Alerts that named `host`, which is no node of the cluster: the first one's name, what
    would match (NodeNames.hint), how many, from when to when."""

    host: str
    alertname: str
    hint: str
    first: datetime
    last: datetime
    alerts: int = 0


@dataclass(frozen=True)
class HostCheck:
    """How the hosts one source of alerts names (dcgm-exporter's, the job logs', ...) match
    the cluster's nodes under a mapping: how many, those that match none, and what would."""

    hosts: int
    unmatched: tuple[str, ...]
    hint: str

    def summary(self, examples: int = 3) -> str:
        if not self.unmatched:
            return f"all {self.hosts:,} hosts are nodes of the cluster"
        shown = ", ".join(self.unmatched[:examples])
        more = (
            f", ... ({len(self.unmatched) - examples:,} more)"
            if len(self.unmatched) > examples
            else ""
        )
        text = (
            f"{len(self.unmatched):,} of {self.hosts:,} hosts match no Slurm node ({shown}{more})"
        )
        return f"{text}: {self.hint}" if self.hint else text


def check_hosts(
    hosts: Iterable[str],
    nodes: Container[str],
    names: NodeNames,
    machines: Mapping[str, str] = NO_HOSTS,
) -> HostCheck:
    """Whether alerts from these hosts would name nodes of the cluster (`slurmedic doctor`);
    `machines`: the node on each machine of another name (ClusterView.hosts)."""
    seen = sorted(set(hosts))
    unmatched = tuple(h for h in seen if names.resolve(h, nodes, machines) is None)
    hinted = [h for h in unmatched if names.hint(h, nodes)]
    hint = ""
    if hinted and len(hinted) * 2 >= len(unmatched):
        hint = "they look like fully qualified names: set node_names.strip_domain in the policy"
    elif unmatched:
        hint = "map them with node_names in the policy (a rewrite), or scrape them by Slurm's names"
    return HostCheck(len(seen), unmatched, hint)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
