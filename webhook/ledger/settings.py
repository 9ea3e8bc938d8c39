"""What the processes tell each other through the ledger's settings table, one model a key.

The webhook workers, the live loop and the CLI are separate processes; the settings table is
how a human's switch reaches the loop and how the loop's heartbeat reaches /metrics. Each key
has one model here, and the ledger reads and writes a key only through its model
(`Ledger.setting(Breaker)`, `Ledger.put(Breaker(...), at)`): a value is checked when it is
written and again when it is read, so a corrupt row is an error naming its key, never a
half-understood dict. The JSON stored is the one earlier releases wrote.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel

from webhook.core import node_names as core


class _Value(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Breaker(_Value):
    """The circuit breaker on drains: opened by the loop, closed only by a human."""

    key: ClassVar[str] = "breaker"
    repair: ClassVar[str] = "`slurmedic breaker reset` writes it anew"
    open: bool = False
    opened_at: AwareDatetime | None = None
    # When a human last closed it: drains before this no longer count against it.
    reset_at: AwareDatetime | None = None


class Switch(_Value):
    """The global switch: every action in monitor mode, whatever the policy says."""

    key: ClassVar[str] = "switch"
    repair: ClassVar[str] = "`slurmedic switch monitor|policy` writes it anew"
    monitor: bool = False


class Heartbeat(_Value):
    """When the live loop last completed a step (Unix seconds; 0: never)."""

    key: ClassVar[str] = "loop"
    repair: ClassVar[str] = "the live loop writes it anew within seconds"
    EVERY: ClassVar[float] = 5.0  # seconds between writes
    at: float = 0.0


class ViewSeen(_Value):
    """When the live loop last read the cluster from Slurm (Unix seconds; 0: never), and what
    Slurm said when a read last failed, while it fails. (A key of its own: a release that
    reads `loop` as it always was may run beside this one during an upgrade.)"""

    key: ClassVar[str] = "view"
    repair: ClassVar[str] = "the live loop writes it anew within seconds"
    at: float = 0.0
    slurm_error: str = ""


class JobSeen(_Value):
    partition: str = ""
    restarts: int = Field(default=0, ge=0)
    eligible: bool


class Jobs(RootModel[dict[str, JobSeen]]):
    """The jobs the loop sees that count for goodput, by Slurm job id."""

    key: ClassVar[str] = "jobs"
    repair: ClassVar[str] = "the live loop writes it anew when one changes, and when it starts"
    model_config = ConfigDict(frozen=True)
    root: dict[str, JobSeen] = Field(default_factory=dict)


class NodeSeen(_Value):
    status: str = ""
    partitions: list[str] = Field(default_factory=list)


class Nodes(RootModel[dict[str, NodeSeen]]):
    """Node states as Slurm reports them, by node name."""

    key: ClassVar[str] = "nodes"
    repair: ClassVar[str] = "the live loop writes it anew when one changes, and when it starts"
    model_config = ConfigDict(frozen=True)
    root: dict[str, NodeSeen] = Field(default_factory=dict)


class Modes(_Value):
    """What the console and `slurmedic nodes` show of the policy the live loop decides with: its
    modes, per action, and per partition (staged enablement), and what makes a node's failures
    repeats (`repeats`)."""

    key: ClassVar[str] = "modes"
    repair: ClassVar[str] = "the live loop writes it anew when it starts"
    mode: str = "monitor"
    actions: dict[str, str] = {}
    partitions: dict[str, dict[str, str]] = {}  # partition: {"*": its mode, action: mode}
    causes: dict[str, dict[str, str]] = {}  # cause: {action: mode}
    partition_causes: dict[str, dict[str, dict[str, str]]] = {}  # partition: its causes
    repeats_window_seconds: float = 7 * 86400
    repeats_count: int = 2
    repeats_apart_seconds: float = 3600


class HostSeen(_Value):
    alertname: str = ""
    hint: str = ""
    alerts: int = Field(default=0, ge=0)
    first: AwareDatetime
    last: AwareDatetime


class Unmatched(_Value):
    """Alerts that named a host which is no node of the cluster (webhook.core.node_names): how
    many in all, and the last MAX_HOSTS hosts seen."""

    key: ClassVar[str] = "unmatched"
    repair: ClassVar[str] = "delete its row: the live loop counts anew from the next such alert"
    MAX_HOSTS: ClassVar[int] = 100
    alerts: int = Field(default=0, ge=0)
    hosts: dict[str, HostSeen] = {}

    def add(self, seen: Iterable[core.Unmatched]) -> Unmatched:
        """These counts added; the hosts seen last kept."""
        hosts, alerts = dict(self.hosts), self.alerts
        for u in seen:
            old = hosts.pop(u.host, None)
            hosts[u.host] = HostSeen(
                alertname=old.alertname if old else u.alertname,
                hint=u.hint,
                alerts=(old.alerts if old else 0) + u.alerts,
                first=old.first if old else u.first,
                last=u.last,
            )
            alerts += u.alerts
        kept = sorted(hosts.items(), key=lambda kv: kv[1].last)[-self.MAX_HOSTS :]
        return Unmatched(alerts=alerts, hosts=dict(kept))


SETTINGS = (Breaker, Switch, Heartbeat, Jobs, Nodes, Modes, Unmatched, ViewSeen)
Setting = Breaker | Switch | Heartbeat | Jobs | Nodes | Modes | Unmatched | ViewSeen
S = TypeVar("S", Breaker, Switch, Heartbeat, Jobs, Nodes, Modes, Unmatched, ViewSeen)


class CorruptSetting(ValueError):
    """A settings row its model does not accept."""
