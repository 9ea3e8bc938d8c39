"""Who answers failures in the simulated cluster, one class a policy:

- `none`: no automation; a person does the right thing after their delay;
- `naive`: drain every node an alert names and requeue its job at once;
- `slurmedic`: the real core (webhook.core.engine, as replay runs it) on the alerts and the
  view, its decisions carried out as in enforce mode; what it escalates a person does later;
  the nodes it drains go through its repair loop (webhook.simulate.repairs) when the policy
  has `repairs.enabled` (the default);
- `slurmedic-norepair`: the same with the repair loop off: its drained nodes wait for a person;
- `oracle`: the right thing at the moment of the failure (perfect attribution, no delay);
- `informed`: the oracle's right thing, done when the first alert about the failure reaches
  the webhook (perfect attribution, no delay of its own): what the monitoring's delays cost by
  themselves, so that the gap between `informed` and `slurmedic` is what slurmedic's own
  waiting and decisions cost. Not one of the compared policies by default.

"The right thing" knows the truth: drain the broken node, requeue the job away from it (from a
broken leaf while it is down), stop a job whose bug recurs until its owner fixed it, requeue
one that a restart cures.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import NamedTuple, Protocol

from webhook.core.alerts import Alert, wrap
from webhook.core.decisions import SCHEDULER_ACTIONS, Decision
from webhook.core.engine import Engine
from webhook.core.incidents import BadIncidentKey, IncidentKey
from webhook.core.lifecycle import PENDING
from webhook.core.policy import Policy
from webhook.simulate.model import NODE_FAULTS
from webhook.simulate.recovery import Recoveries
from webhook.simulate.repairs import RepairLoop
from webhook.simulate.trace import Fault
from webhook.simulate.world import EPOCH, SimJob, World, node_name, when

NOREPAIR = "slurmedic-norepair"
POLICIES = ("none", "naive", "slurmedic", NOREPAIR, "informed", "oracle")
COMPARED = ("none", "naive", "slurmedic", NOREPAIR, "oracle")  # run unless asked otherwise


class Responder(Protocol):
    def alert(self, alert: Alert) -> None: ...
    def failure(self, fault: Fault, jobs: list[SimJob]) -> None: ...
    def changed(self) -> None: ...
    def next_due(self) -> float | None: ...
    def tick(self) -> None: ...


def remedy(world: World, fault: Fault, jobs: list[tuple[SimJob, int]], *, oracle: bool) -> None:
    """The right thing about `fault` for the attempts it hit (those still current): drain the
    broken node, and requeue each job away from every node known bad now (broken, or under a
    leaf that is down); a job that does not fit away from a down leaf is requeued once the leaf
    is mended."""
    if fault.kind in NODE_FAULTS:
        world.drain([node_name(fault.where)])
    bad = world.known_bad()
    for job, attempt in jobs:
        if job.restarts != attempt:
            continue  # someone moved it on meanwhile
        if fault.kind == "app" and job.fixed_at is not None and job.fixed_at > world.now:
            # Its owner submits it again once the bug is fixed: the oracle the moment it is.
            world.stop(job, back=job.fixed_at if oracle else None)
        elif world.fits_without(job, bad):
            world.requeue(job, bad)
            world.lift_when_mended(job, bad)
        elif (mended := world.mended_by()) > world.now:
            world.later(mended, partial(remedy, world, fault, [(job, attempt)], oracle=oracle))
        else:
            world.requeue(job, [node_name(fault.where)] if fault.kind in NODE_FAULTS else [])


class Person:
    """Shared by `none` and by what slurmedic escalates: a person acts after their delay."""

    def __init__(self, world: World) -> None:
        self.world = world

    def handle(self, fault: Fault, jobs: list[SimJob]) -> None:
        w = self.world
        attempts = [(j, j.restarts) for j in jobs]
        w.person_on.update((j.id, attempt) for j, attempt in attempts)
        # Named by the failure and its first job, not by the job's state or attempt (which
        # differ between policies): the same failure, the same person's delay.
        took = w.person("handle", fault.at, fault.kind, fault.where, *[j.id for j in jobs[:1]])
        w.later(w.now + took, partial(remedy, w, fault, attempts, oracle=False))


class _Passive:
    def alert(self, alert: Alert) -> None:
        pass

    def failure(self, fault: Fault, jobs: list[SimJob]) -> None:
        pass

    def changed(self) -> None:
        pass

    def next_due(self) -> float | None:
        return None

    def tick(self) -> None:
        pass


class NoAutomation(_Passive):
    def __init__(self, world: World) -> None:
        self.person = Person(world)

    def failure(self, fault: Fault, jobs: list[SimJob]) -> None:
        self.person.handle(fault, jobs)


class Oracle(_Passive):
    def __init__(self, world: World) -> None:
        self.world = world

    def failure(self, fault: Fault, jobs: list[SimJob]) -> None:
        remedy(self.world, fault, [(j, j.restarts) for j in jobs], oracle=True)


class _Told(NamedTuple):
    fault: Fault
    attempts: list[tuple[SimJob, int]]
    keys: list[tuple[str, str]]  # the (label, value) its alerts name it by


class Informed(_Passive):
    """The oracle's remedy of each failure, once an alert the failure raised has reached the
    webhook: an alert names a node (what broke there, or the leaf above it) or a job (what
    stopped its attempt). A failure no alert tells of is left to the job's owner."""

    def __init__(self, world: World) -> None:
        self.world = world
        # Failures not yet remedied, by each (label, value) their alerts name them by.
        self.pending: dict[tuple[str, str], list[_Told]] = {}

    def failure(self, fault: Fault, jobs: list[SimJob]) -> None:
        if fault.kind == "switch":
            nodes = [n.name for n in self.world.nodes if n.leaf == fault.where]
        else:
            nodes = [node_name(fault.where)] if fault.kind in NODE_FAULTS else []
        keys = [("node", n) for n in nodes] + [("slurm_job_id", str(j.id)) for j in jobs]
        told = _Told(fault, [(j, j.restarts) for j in jobs], keys)
        for key in keys:
            self.pending.setdefault(key, []).append(told)

    def alert(self, alert: Alert) -> None:
        started = (alert.startsAt - EPOCH).total_seconds()
        for key in (
            ("node", alert.labels.get("node", "")),
            ("slurm_job_id", alert.labels.get("slurm_job_id", "")),
        ):
            # A late alert of an earlier failure tells nothing of a newer one (startsAt is
            # whole seconds).
            for told in [t for t in self.pending.get(key, []) if t.fault.at <= started + 1]:
                for k in told.keys:  # remedied once, whichever alert comes next
                    self.pending[k].remove(told)
                    if not self.pending[k]:
                        del self.pending[k]
                remedy(self.world, told.fault, told.attempts, oracle=True)


class Naive(_Passive):
    """Drain every node an alert names; requeue the job of an alert about its current attempt
    at once, away from the nodes drained so far."""

    def __init__(self, world: World) -> None:
        self.world = world

    def alert(self, alert: Alert) -> None:
        w, labels = self.world, alert.labels
        if node := labels.get("node"):
            w.drain([node])
        job = w.job_of(labels.get("slurm_job_id", ""))
        if job is None and node and (held := w.nodes[w.node_index(node)].job) is not None:
            job = w.jobs[held]
        current = job is not None and when(job.started) <= alert.startsAt
        if job is not None and current and job.state not in ("PENDING", "CANCELLED"):
            gone = [w.nodes[i].name for i in job.nodes if w.nodes[i].out]
            w.requeue(job, gone)


class Slurmedic(_Passive):
    """The real core, as `slurmedic replay` runs it, on the simulated clock; its decisions are
    carried out as the executor would (a requeue or a stop only of the attempt decided on)."""

    def __init__(self, world: World, policy: Policy) -> None:
        self.world = world
        # What-if it acted: every action in enforce mode, on every partition.
        acting = policy.model_copy(update={"mode": "enforce", "actions": {}, "partitions": {}})
        self.engine = Engine.with_history(world.view, acting, [])
        self.recoveries = Recoveries(world, acting, self.engine) if world.cfg.verify else None
        self.repairs = RepairLoop(world, acting) if acting.repairs.enabled else None
        self.person = Person(world)
        self.carried: dict[str, set[str]] = {}
        self.decisions: list[Decision] = []

    def _now(self) -> datetime:
        return when(self.world.now)

    def alert(self, alert: Alert) -> None:
        if self.repairs is not None:
            self.repairs.heard(alert)
        self.engine.receive(wrap([alert]), self._now())

    def changed(self) -> None:
        self.engine.update_view(self.world.view, self._now())
        self._verify()
        if self.repairs is not None:
            self.repairs.advance()

    def next_due(self) -> float | None:
        due = self.engine.next_due()
        dues = [] if due is None else [(due - EPOCH).total_seconds()]
        if self.recoveries is not None and (checked := self.recoveries.next_due()) is not None:
            dues.append(checked)
        return min(dues, default=None)

    def tick(self) -> None:
        self.engine.close(
            {k: self.carried[k] for k in self.engine.revisable() if k in self.carried}
        )
        self._decided(self.engine.tick(self._now()))
        # What the live loop hands its ledger: nothing keeps it here (a year's run must not
        # pile it up).
        self.engine.take_failures()
        self.engine.take_rejudged()
        self._verify()
        self.world.flush()

    def _verify(self) -> None:
        # The live loop judges every few seconds; here, whenever the cluster changed (an
        # attempt started or ended) and at a successor's deadline.
        if self.recoveries is not None:
            self._decided(self.recoveries.judge())

    def _decided(self, decisions: list[Decision]) -> None:
        for d in decisions:
            self.decisions.append(d)
            if d.state == PENDING:
                self._carry_out(d)

    @staticmethod
    def _key(d: Decision) -> IncidentKey | None:
        try:
            return IncidentKey.parse(d.incident)
        except BadIncidentKey:
            return None

    def _attempt(self, d: Decision) -> SimJob | None:
        """The job, when the attempt decided on is still its current one."""
        key = self._key(d)
        if key is None or key.job is None:
            return None
        job = self.world.jobs.get(key.job)
        return job if job is not None and job.restarts == key.attempt else None

    def _recovering(self, d: Decision) -> SimJob | None:
        """The job of a failed recovery's escalation: its attempt now, whichever it is (a person
        looks at the job; they act only if that attempt failed too)."""
        key = self._key(d)
        if key is None or key.kind != "verify" or not key.job:
            return None
        return self.world.jobs.get(key.job)

    def _node_of(self, d: Decision) -> list[str]:
        key = self._key(d)
        return [key.node] if key is not None and key.node is not None else []

    def _carry_out(self, d: Decision) -> None:
        w = self.world
        if d.action in SCHEDULER_ACTIONS:
            # What the live loop's ledger calls carried out: an escalation stays revisable.
            self.carried.setdefault(d.incident, set()).add(d.action)
        if d.action == "drain":
            w.drain(d.nodes)
            if self.repairs is not None:
                self.repairs.drained(d)
        elif d.action in ("requeue", "stop") and (job := self._attempt(d)) is not None:
            if d.action == "requeue":
                fault_at = job.fault.at if job.fault is not None else w.now
                if w.requeue(job, d.exclude, readmit=d.readmit) and self.recoveries is not None:
                    self.recoveries.watch(d.incident, d.cause, job, fault_at)
            else:
                w.stop(job)
        elif d.action == "escalate":
            w.tally.escalations += 1
            job = self._attempt(d) or self._recovering(d)
            if job is not None and job.fault is not None:
                self.person.handle(job.fault, [job])
            for name in d.nodes or self._node_of(d):
                node = w.nodes[w.node_index(name)]
                if node.broken is not None:
                    self.person.handle(node.broken, [])
        elif d.action == "resume":
            for name in d.nodes:
                w.resume(w.nodes[w.node_index(name)])


def responder(name: str, world: World, policy: Policy) -> Responder:
    if name == "none":
        return NoAutomation(world)
    if name == "naive":
        return Naive(world)
    if name == "oracle":
        return Oracle(world)
    if name == "informed":
        return Informed(world)
    if name == "slurmedic":
        return Slurmedic(world, policy)
    if name == NOREPAIR:
        off = policy.repairs.model_copy(update={"enabled": False})
        return Slurmedic(world, policy.model_copy(update={"repairs": off}))
    raise ValueError(f"policy: {name!r} is not one of {', '.join(POLICIES)}")
