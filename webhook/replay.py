"""`slurmedic replay`: the real core over a scenario file, on a simulated clock.

The format and the output are a public contract (docs/scenarios.md): old files must
keep working. A file that is not a valid scenario raises ScenarioError naming the field.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import hostlist
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from webhook.core.alerts import Alert, Payload, wrap
from webhook.core.cluster import ACTIVE_STATES, JOB_BASE_STATES, NODE_NAME, ClusterView, Job, Node
from webhook.core.decisions import Decision, PastAction
from webhook.core.engine import Engine
from webhook.core.node_names import Unmatched
from webhook.core.policy import PolicyError, load_policy
from webhook.core.signals import SIGNALS
from webhook.core.validation import describe
from webhook.files import FileError, load_mapping


class ScenarioError(ValueError):
    """Not a valid scenario; the message names the field and why."""


# A job's `state:`: Slurm's base states, and the flags a job is seen in while it moves.
JOB_STATES = frozenset(JOB_BASE_STATES | ACTIVE_STATES | {"REQUEUED", "REQUEUE_HOLD"})


def _expand(expr: str) -> list[str]:
    try:
        nodes = list(hostlist.expand_hostlist(expr))
    except hostlist.BadHostlist as e:
        raise ValueError(f"{expr!r} is not a Slurm hostlist ({e})") from e
    bad = [n for n in nodes if not NODE_NAME.match(n)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a valid node name")
    return nodes


def _hostlist(v: str) -> str:
    if v:
        _expand(v)
    return v


Hostlist = Annotated[str, AfterValidator(_hostlist)]


class _Model(BaseModel):
    # A misspelled key (`swtiches:`) is an error naming it, never a setting silently lost.
    model_config = ConfigDict(extra="forbid")


class NodeGroup(_Model):
    names: Hostlist = Field(min_length=1)
    partition: str = ""
    gpus: int = 8
    state: str = "idle"
    reason: str = ""


class SwitchSpec(_Model):
    name: str
    nodes: Hostlist = Field(min_length=1)


class JobSpec(_Model):
    id: int = Field(ge=1)
    name: str = ""
    user: str = ""
    partition: str = ""
    nodes: Hostlist = ""
    state: str = "RUNNING"
    requeue: bool = True
    restarts: int = Field(default=0, ge=0)
    comment: str = ""
    started: AwareDatetime | None = None
    ended: AwareDatetime | None = None  # a job that ended before the scenario starts: when
    exit_code: int | None = Field(default=None, ge=0, le=255)  # of a job that ended


class ClusterSpec(_Model):
    nodes: list[NodeGroup] = []
    switches: list[SwitchSpec] = []
    jobs: list[JobSpec] = []


class JobChange(_Model):
    id: int
    name: str | None = None
    user: str | None = None
    partition: str | None = None
    state: str | None = None
    nodes: Hostlist | None = None
    restarts: int | None = Field(default=None, ge=0)
    comment: str | None = None
    requeue: bool | None = None
    started: AwareDatetime | None = None  # a requeued attempt's start
    ended: AwareDatetime | None = None
    exit_code: int | None = Field(default=None, ge=0, le=255)


class ClusterChange(_Model):
    jobs: list[JobChange] = []
    nodes: list[NodeGroup] = []


class Event(_Model):
    at: AwareDatetime
    alerts: list[Alert] | None = None
    payload: Payload | None = None
    cluster: ClusterChange | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Event:
        kinds = [k for k in ("alerts", "payload", "cluster") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("needs exactly one of alerts, payload, cluster")
        if self.alerts is not None and not self.alerts:
            raise ValueError("alerts: at least one alert")
        return self


class HistoryEntry(_Model):
    at: AwareDatetime
    # `recovered`: a recovery check saw the job train again after a requeue.
    action: Literal["drain", "requeue", "stop", "escalate", "resume", "none", "recovered"]
    job: int | None = None
    nodes: list[str] = []
    exclude: list[str] = []
    cause: str = ""
    incident: str = ""  # the incident that decided it (`1001.0`), when known


class Scenario(_Model):
    # Keys of its own at the top (a site's notes, tags) are kept and ignored; `unknown` names
    # them, so that a misspelled one is said.
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str = ""
    start: AwareDatetime
    until: AwareDatetime
    policy: dict[str, Any] | None = None
    cluster: ClusterSpec
    history: list[HistoryEntry] = []
    events: list[Event] = []
    expect: dict[str, Any] | None = None

    @property
    def unknown(self) -> list[str]:
        """Top-level keys the format does not have (kept, and ignored)."""
        return sorted(self.model_extra or {})

    @model_validator(mode="after")
    def _times(self) -> Scenario:
        if self.until < self.start:
            raise ValueError("until: is before start")
        for i, e in enumerate(self.events):
            if not self.start <= e.at <= self.until:
                raise ValueError(f"events.{i}.at: outside start..until")
            if i and e.at < self.events[i - 1].at:
                raise ValueError(f"events.{i}.at: events must be in time order")
        return self

    @model_validator(mode="after")
    def _vocabulary(self) -> Scenario:
        """A mistyped signal, job state or node would otherwise pass silently: the alert is
        kept and never acted on, the job is neither running nor ended, the node is unknown."""
        cluster = {n for g in self.cluster.nodes for n in _expand(g.names)}
        cluster |= {
            n for e in self.events if e.cluster for g in e.cluster.nodes for n in _expand(g.names)
        }

        def outside(where: str, nodes: list[str]) -> None:
            if bad := [n for n in nodes if n not in cluster]:
                raise ValueError(f"{where}: {bad[0]!r} is not a node of the scenario's cluster")

        def state(where: str, value: str | None) -> None:
            if value is not None and value not in JOB_STATES:
                raise ValueError(f"{where}: {value!r} is not a Slurm job state")

        for i, sw in enumerate(self.cluster.switches):
            outside(f"cluster.switches.{i}.nodes", _expand(sw.nodes))
        for i, j in enumerate(self.cluster.jobs):
            state(f"cluster.jobs.{i}.state", j.state)
            outside(f"cluster.jobs.{i}.nodes", _expand(j.nodes) if j.nodes else [])
        for i, h in enumerate(self.history):
            outside(f"history.{i}.nodes", [*h.nodes, *h.exclude])
        for i, e in enumerate(self.events):
            for k, jc in enumerate(e.cluster.jobs if e.cluster else []):
                state(f"events.{i}.cluster.jobs.{k}.state", jc.state)
                outside(f"events.{i}.cluster.jobs.{k}.nodes", _expand(jc.nodes or ""))
            alerts = e.alerts or (e.payload.alerts if e.payload else [])
            for k, a in enumerate(alerts):
                signal = a.labels.get("signal", "")
                if signal and signal not in SIGNALS:
                    known = ", ".join(sorted(SIGNALS))
                    raise ValueError(
                        f"events.{i}.alerts.{k}.labels.signal: {signal!r} is not one of {known}"
                    )
        return self


def load(path: Path) -> Scenario:
    try:
        data = load_mapping(path, "scenario")
    except FileError as e:
        raise ScenarioError(str(e)) from e
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(f"{path}: {describe(e)}") from e


def build_view(spec: ClusterSpec) -> ClusterView:
    switch_of = {n: s.name for s in spec.switches for n in _expand(s.nodes)}
    view = ClusterView(switches={s.name: tuple(_expand(s.nodes)) for s in spec.switches})
    for group in spec.nodes:
        for n in _expand(group.names):
            view.nodes[n] = Node(n, group.partition, group.state, group.reason, switch_of.get(n))
    for j in spec.jobs:
        view.set_job(
            Job(
                id=j.id,
                nodes=tuple(_expand(j.nodes)) if j.nodes else (),
                partition=j.partition,
                name=j.name,
                user=j.user,
                state=j.state,
                requeue=j.requeue,
                restarts=j.restarts,
                comment=j.comment,
                started=j.started,
                ended=j.ended,
                exit_code=j.exit_code,
            )
        )
    return view


def apply_change(view: ClusterView, change: ClusterChange, at: AwareDatetime) -> None:
    for group in change.nodes:
        for n in _expand(group.names):
            old = view.nodes.get(n)
            view.nodes[n] = Node(
                n,
                group.partition or (old.partition if old else ""),
                group.state,
                group.reason,
                old.switch if old else None,
            )
    for jc in change.jobs:
        old_job = view.jobs.get(jc.id) or Job(id=jc.id, nodes=())
        # The fields a change may set (other keys are left alone, as everywhere in the format).
        known = set(JobChange.model_fields) - {"id"}
        updates = {k: v for k, v in jc.model_dump(include=known).items() if v is not None}
        if "nodes" in updates:
            updates["nodes"] = tuple(_expand(updates["nodes"]))
        new_job = replace(old_job, **updates)
        if new_job.ended is None and new_job.interrupted and not old_job.interrupted:
            new_job = replace(new_job, ended=at)  # the scenario's clock says when it ended
        view.set_job(new_job)


@dataclass(frozen=True)
class Replayed:
    """What a replay decided, and the hosts its alerts named that are no node of the cluster
    (never acted on; NodeNames.hint says what would match)."""

    decisions: list[Decision]
    unmatched: list[Unmatched]


def run(scenario: Scenario) -> list[Decision]:
    return replay(scenario).decisions


def replay(scenario: Scenario) -> Replayed:
    try:
        policy = load_policy(scenario.policy, prefix="policy.")
    except PolicyError as e:
        raise ScenarioError(str(e)) from e
    view = build_view(scenario.cluster)
    history = [
        PastAction(
            at=h.at,
            action=h.action,
            job=h.job,
            nodes=tuple(h.nodes),
            exclude=tuple(h.exclude),
            cause=h.cause,
            incident=h.incident,
        )
        for h in scenario.history
    ]
    engine = Engine.with_history(view, policy, history)
    decisions: list[Decision] = []
    # Deliveries and cluster changes at a time come before decisions falling due at that time.
    queue = [(e.at, i, e) for i, e in enumerate(scenario.events)]
    heapq.heapify(queue)
    while True:
        due = engine.next_due()
        if queue and (due is None or queue[0][0] <= due):
            at, _, event = heapq.heappop(queue)
            if event.cluster is not None:
                apply_change(engine.view, event.cluster, at)
                engine.update_view(engine.view, at)
            else:
                payload = event.payload or wrap(event.alerts or [])
                engine.receive(payload, at)
        elif due is not None and due <= scenario.until:
            decisions = supersede(decisions, engine.tick(due))
            engine.take_failures()  # what the live loop hands its ledger: no ledger here
            engine.take_rejudged()
        else:
            break
    unmatched = engine.take_unmatched()
    return Replayed(decisions, unmatched)


def supersede(earlier: list[Decision], new: list[Decision]) -> list[Decision]:
    """Append new decisions; a revision marks its incident's earlier decisions superseded
    (nothing is carried out in a replay, so every one of them still could be)."""
    revised = {d.incident: d.revision for d in new if d.revision}
    kept = [
        replace(d, state="superseded")
        if d.incident in revised and d.revision < revised[d.incident]
        else d
        for d in earlier
    ]
    return kept + new


def replay_json(path: Path | Scenario) -> dict[str, Any]:
    scenario = load(path) if isinstance(path, Path) else path
    done = replay(scenario)
    out: dict[str, Any] = {
        "scenario": scenario.name,
        "decisions": [d.to_json() for d in done.decisions],
    }
    if done.unmatched:  # an extension of the contract: only there when there are any
        out["unmatched"] = [
            {"host": u.host, "alerts": u.alerts, "alertname": u.alertname, "hint": u.hint}
            for u in done.unmatched
        ]
    return out


def matches(decision: dict[str, Any], want: dict[str, Any], *, overlap: bool) -> bool:
    """`expect.decisions`: every key given equal, lists as sets. `expect.never` (`overlap`):
    scalars equal, lists sharing an element."""
    for key, value in want.items():
        got = decision.get(key)
        if isinstance(value, list):
            got_set, want_set = set(got or []), set(value)
            if (not got_set & want_set) if overlap else got_set != want_set:
                return False
        elif got != value:
            return False
    return True


def unmet(expect: dict[str, Any] | None, decisions: list[dict[str, Any]]) -> list[str]:
    """What of a scenario's `expect` the decisions do not hold, one line each (empty: all)."""
    expect = expect or {}
    out = []
    for want in expect.get("decisions", []):
        if not any(matches(d, want, overlap=False) for d in decisions):
            out.append(f"expected, not decided: {want}")
    for never in expect.get("never", []):
        for d in decisions:
            if matches(d, never, overlap=True):
                what = {k: d.get(k) for k in ("incident", "action", "nodes", "exclude", "state")}
                out.append(f"decided, but never expected ({never}): {what}")
    return out
