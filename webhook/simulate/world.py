"""The simulated cluster: nodes that break and are mended, jobs that train, checkpoint, stall,
fail and are requeued, and the alerts the rules would send about all of it, on a clock of
seconds. Responders (webhook.simulate.responders) act on it through `drain`, `requeue`, `stop`
and `later`; it keeps the core's view of it (a ClusterView) as Slurm would show it.

What it keeps of each job is what ETTR needs: productive time is checkpointed training; a
failure loses the work since the last checkpoint, the wait until the next attempt starts and
that attempt's start-up."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

from webhook.core.alerts import Alert, fingerprint
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.validation import is_number
from webhook.simulate.model import Delays, JobClass, SimConfig
from webhook.simulate.trace import Fault, leaves

EPOCH = datetime(2026, 1, 5, tzinfo=UTC)  # the simulated span's start (a Monday)
PARTITION = "train"
FOREVER = math.inf


def when(t: float) -> datetime:
    return EPOCH + timedelta(seconds=t)


LONG = {"alloc": "allocated", "drain": "drained"}  # sinfo's long state, for a `*`


def node_name(i: int) -> str:
    return f"gpu{i + 1:05d}"


# What is done to a node, or a job on it, this long after a blip made it not respond is
# counted as done for the blip (Tally.blip_*).
BLIP_BLAME = 3600.0
# The loss breakdown's names for what is not a fault of the trace.
START = "start"  # first starts and their queue
NEEDLESS = "needless"  # an attempt a policy requeued or stopped with nothing wrong


@dataclass
class SimNode:
    index: int
    name: str
    leaf: int
    broken: Fault | None = None  # the truth: a gpu, node or link fault not yet mended
    out: str = ""  # "drain" or "down": out of service
    job: int | None = None
    silent: bool = False  # Slurm shows it not responding (`*`): a blip
    blipped: float = -math.inf  # when a blip last made it so


@dataclass
class SimJob:
    id: int
    cls: JobClass
    gpus: int
    nodes: list[int] = field(default_factory=list)
    state: str = "PENDING"
    restarts: int = 0
    started: float = 0.0
    ended: float | None = None
    stalled: float | None = None  # when the current attempt stopped making progress
    fault: Fault | None = None  # what stopped it (the truth)
    exclude: frozenset[int] = frozenset()
    fixed_at: float | None = None  # a recurring bug in its code is fixed then
    productive: float = 0.0
    attempts: int = 0
    not_before: float = 0.0  # a requeued job starts no sooner
    # The kind of fault the current attempt answers for (START for its first), and when the
    # job last stopped training (its last attempt's end): the loss breakdown's bookkeeping.
    cause: str = START
    idle_since: float = 0.0
    # Training progress as the job reports it (in seconds of training): where the current
    # attempt resumed from, and how far the last attempt to end had got.
    resumed: float = 0.0
    reached: float = 0.0

    @property
    def share(self) -> float:
        """The share of training time that is training, checkpoint writes aside."""
        every = self.cls.checkpoint_every.total_seconds()
        return every / (every + self.cls.checkpoint_write.total_seconds())

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    def progress(self, t: float) -> tuple[float, float] | None:
        """The current attempt's step and last checkpoint by `t` (None before it started)."""
        if self.state == "PENDING":
            return None
        if self.running:
            return self.resumed + self.saved(t, last=True), self.resumed + self.saved(t)
        return self.reached, self.productive

    def saved(self, t: float, *, last: bool = False) -> float:
        """Checkpointed training of the current attempt by `t` (`last`: the span ends, nothing
        is lost)."""
        cls = self.cls
        trained = min(self.stalled if self.stalled is not None else t, t)
        trained -= self.started + cls.restart.total_seconds()
        if trained <= 0:
            return 0.0
        every = cls.checkpoint_every.total_seconds()
        cycle = every + cls.checkpoint_write.total_seconds()
        done, rest = divmod(trained, cycle)
        return done * every + (min(rest, every) if last else 0.0)


@dataclass
class Tally:
    """What happened, counted the same for every policy."""

    drains: int = 0
    healthy_drained: int = 0  # drains of nodes nothing was wrong with
    requeues: int = 0
    stops: int = 0
    needless_stops: int = 0  # stops of jobs a requeue would have brought back
    escalations: int = 0
    alerts: int = 0
    failures: int = 0  # failures that hit a job (recurrences included)
    owner_restarts: int = 0  # failed jobs nobody had acted on when their owner looked
    needless_requeues: int = 0  # requeues of attempts that ran with nothing wrong
    # Blips (none unless the config has them): how many, how many Slurm saw (a ping fell
    # within), and what was done to healthy nodes and jobs for them within BLIP_BLAME after.
    blips: int = 0
    blips_seen: int = 0
    blip_drained: int = 0  # healthy nodes a blip hit, drained
    blip_requeues: int = 0  # attempts with nothing wrong, on a node a blip hit, requeued
    # GPU-seconds of training lost against the ideal run, by the kind of fault that ended the
    # attempt (its unsaved work, its restart, and the wait until the next attempt starts); an
    # attempt no fault ended answers for the fault that made it. START: the first queue.
    lost: dict[str, float] = field(default_factory=dict)
    # Nodes out of service (drained or down): their node-seconds over the span, and the most
    # at once.
    out_node_seconds: float = 0.0
    out_peak: int = 0
    # slurmedic's repair loop (webhook.simulate.repairs): resets and reboots run, nodes it
    # returned to service, and nodes it sent to a person for replacement.
    repairs: int = 0
    repaired: int = 0
    replaced: int = 0


class World:
    def __init__(self, cfg: SimConfig, delays: Delays) -> None:
        self.cfg = cfg
        self.delays = delays
        self.now = 0.0
        self.tally = Tally()
        self.nodes = [SimNode(i, node_name(i), i // cfg.leaf_nodes) for i in range(cfg.nodes)]
        self.leaf_down_until = [0.0] * leaves(cfg)
        self.jobs: dict[int, SimJob] = {}
        ids = itertools.count(1)
        for cls in cfg.jobs:
            for _ in range(cls.count):
                job = SimJob(next(ids), cls, cls.nodes * cfg.gpus_per_node)
                self.jobs[job.id] = job
        self.view = ClusterView(
            switches={
                f"leaf{leaf:04d}": tuple(n.name for n in self.nodes if n.leaf == leaf)
                for leaf in range(len(self.leaf_down_until))
            }
        )
        self.idle: set[int] = set()  # nodes a job could start on (kept by _show_node)
        self.out: set[int] = set()  # nodes out of service (kept by _show_node)
        self._out_since = 0.0  # when their count last changed
        for n in self.nodes:
            self._show_node(n)
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        # Set by the run: where alerts and failures go, and the view's changes.
        self.on_alert: Callable[[Alert], None] = lambda _a: None
        self.on_failure: Callable[[Fault, list[SimJob]], None] = lambda _f, _j: None
        self.on_change: Callable[[], None] = lambda: None
        self.on_owner: Callable[[Fault, SimJob], None] = lambda _f, _j: None
        self._changed = False
        self._held: dict[tuple[tuple[str, str], ...], float] = {}  # series: firing until
        # Attempts a person has been asked to see to (no automation, an escalation): their
        # owner does not look a second time.
        self.person_on: set[tuple[int, int]] = set()

    # ---- the clock ---------------------------------------------------------------------
    def later(self, at: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (at, next(self._seq), fn))

    def next_event(self) -> float | None:
        return self._events[0][0] if self._events else None

    def step(self) -> None:
        """Run every event due at the earliest time, then tell the responder what changed."""
        at = self._events[0][0]
        self.now = max(self.now, at)
        while self._events and self._events[0][0] == at:
            heapq.heappop(self._events)[2]()
        self.flush()

    def flush(self) -> None:
        if self._changed:
            self._changed = False
            self.on_change()

    # ---- the core's view ---------------------------------------------------------------
    def _show_node(self, n: SimNode) -> None:
        if bool(n.out) != (n.index in self.out):
            self._count_out()
            (self.out.add if n.out else self.out.discard)(n.index)
            self.tally.out_peak = max(self.tally.out_peak, len(self.out))
        state = n.out or ("alloc" if n.job is not None else "idle")
        if state == "idle":
            self.idle.add(n.index)
        else:
            self.idle.discard(n.index)
        if n.silent:
            self.idle.discard(n.index)  # Slurm places nothing on a node that does not respond
        reason = {"drain": "slurmedic sim", "down": "Not responding"}.get(n.out, "")
        self.view.nodes[n.name] = Node(
            n.name,
            PARTITION,
            state,
            reason,
            f"leaf{n.leaf:04d}",
            status=f"{LONG.get(state, state)}*" if n.silent else "",
            gpus=self.cfg.gpus_per_node,
        )
        self._changed = True

    def _count_out(self) -> None:
        """The node-seconds out of service since the count last changed."""
        self.tally.out_node_seconds += len(self.out) * (self.now - self._out_since)
        self._out_since = self.now

    def _show_job(self, j: SimJob) -> None:
        self.view.set_job(
            Job(
                id=j.id,
                nodes=tuple(self.nodes[i].name for i in j.nodes),
                partition=PARTITION,
                name=j.cls.name,
                user="sim",
                comment=j.cls.comment,
                state=j.state,
                restarts=j.restarts,
                started=when(j.started),
                ended=when(j.ended) if j.ended is not None else None,
            )
        )
        self._changed = True

    # ---- chance ------------------------------------------------------------------------
    def chance(self, *key: object) -> random.Random:
        """A stream for one draw, named by what it is for: the same failure gets the same
        alert delays and the same person's delay under every policy, whatever else each
        policy made happen before it (one shared stream would not)."""
        return random.Random("|".join(map(str, (self.cfg.seed, *key))))

    def person(self, *key: object) -> float:
        """How long a person takes, for the occasion `key` names."""
        return self.cfg.human.draw(self.chance("person", *key))

    def job_of(self, name: str) -> SimJob | None:
        return self.jobs.get(int(name)) if is_number(name) else None

    def node_index(self, name: str) -> int:
        return int(name.removeprefix("gpu")) - 1

    # ---- alerts ------------------------------------------------------------------------
    def _alert(self, cond: float, rule_for: float, labels: dict[str, str], **notes: str) -> None:
        """An alert whose condition holds from `cond`: it fires after the scrape, the
        evaluation and its `for:`, and reaches the webhook within a group interval."""
        d = self.delays
        series = tuple(sorted(labels.items()))
        rng = self.chance("alert", f"{cond:.3f}", series)
        fired = cond + d.fires(rng, rule_for)
        received = fired + d.notifies(rng)
        # The rules hold an event as evidence for their window (a log line, an XID): the same
        # series seen again within it is the alert still firing, not a new one.
        if self._held.get(series, -math.inf) > cond:
            self._held[series] = cond + d.window
            return
        self._held[series] = cond + d.window
        alert = Alert.model_construct(
            status="firing",
            labels=labels,
            annotations={"summary": f"{labels['alertname']} on {labels.get('node', '')}", **notes},
            startsAt=when(math.floor(fired)),
            endsAt=None,
            generatorURL="",
            fingerprint=fingerprint(labels),  # as Alertmanager's, from the labels
        )

        def deliver() -> None:
            self.tally.alerts += 1
            self.on_alert(alert)

        self.later(received, deliver)

    def _crash_node(self, job: SimJob, f: Fault) -> int:
        """The node of one rank's crash: the fault's, when the job runs there."""
        return f.where if f.where in job.nodes else job.nodes[0]

    def _job_alerts(
        self,
        job: SimJob,
        cond: float,
        alertname: str,
        signal: str,
        named: str | None = None,
        only: int | None = None,
        **notes: str,
    ) -> None:
        """A job-side alert from every node of the attempt (`only`: that node's alone), when its
        condition comes, if the attempt still runs then (one rank a node: its ranks say the
        same). `named`: the rule labels the alert with its line's time under this name (each
        line a new alert)."""
        per_node, attempt = self.cfg.gpus_per_node, job.restarts
        event = {named: str(int(when(cond).timestamp()))} if named else {}

        def emit() -> None:
            if job.restarts != attempt or not job.running:
                return  # requeued or ended meanwhile: its ranks are gone
            for rank, i in enumerate(job.nodes):
                if only is not None and i != only:
                    continue
                labels = {
                    "alertname": alertname,
                    "severity": "warning",
                    "signal": signal,
                    "node": self.nodes[i].name,
                    "slurm_job_id": str(job.id),
                    "rank": str(rank * per_node),
                } | event
                self._alert(cond, 0.0, labels, **notes)

        self.later(cond, emit)

    # ---- failures ----------------------------------------------------------------------
    def fail(self, f: Fault) -> None:
        """A failure from the trace happens now."""
        if f.kind == "switch":
            self._switch(f)
            return
        if f.kind == "blip":
            self._blip(f)
            return
        node = self.nodes[f.where]
        if f.kind in ("app", "hang"):
            job = self.jobs.get(node.job) if node.job is not None else None
            if job is None:
                return  # nothing ran there
            if f.kind == "app" and f.recurs:
                # The bug is in the job's code from now on, whether or not it runs now: the
                # next attempt started before the fix crashes too.
                job.fixed_at = max(job.fixed_at or 0.0, self.now + f.fix_after)
            if job.running and job.stalled is None:
                self._hit(job, f)
                self.on_failure(f, [job])
            return
        if node.broken is not None or node.out == "down":
            return  # already broken: nothing more to see
        node.broken = f
        if node.out == "drain":
            self._mend_later(node)  # out of service already: found and mended
        self._manifest(f)

    def _manifest(self, f: Fault) -> None:
        """A broken node shows it: to its job, and to the rules."""
        node, d, t = self.nodes[f.where], self.delays, self.now
        job = self.jobs.get(node.job) if node.job is not None else None
        victim = job if job is not None and job.running and job.stalled is None else None
        labels = {"node": node.name, "severity": "critical"}
        if f.kind == "gpu":
            if victim is not None:
                labels["slurm_job_id"] = str(victim.id)  # dcgm-exporter's job mapping
            self._alert(
                t,
                0.0,
                labels
                | {
                    "alertname": "GpuXidNodeFault",
                    "signal": "gpu_hw",
                    "gpu": str(f.gpu),
                    "xid": str(f.xid),
                },
            )
        elif f.kind == "link":
            self._alert(
                t,
                d.ib_port_down_for,
                labels
                | {"alertname": "NodeInfinibandPortDown", "signal": "network", "device": "mlx5_0"},
            )
        elif f.kind == "node":
            # slurmctld pings every SlurmdTimeout/3: the node shows not responding (`alloc*`,
            # which the rule takes) after a ping or two, down at SlurmdTimeout.
            self.later(t + d.slurmd_timeout, lambda: self._down(node))
            self._alert(
                t + d.slurmd_timeout / 3 * (1 + self.chance("ping", f.at, f.where).random()),
                d.node_down_for,
                labels | {"alertname": "SlurmNodeDown", "signal": "node_down"},
            )
        if victim is not None:
            self._hit(victim, f)
        self.on_failure(f, [victim] if victim is not None else [])

    def _down(self, node: SimNode) -> None:
        if node.broken is None or node.out == "down":
            return
        node.out = "down"  # Slurm's own doing; mended after the repair time
        self._show_node(node)
        self._mend_later(node)

    def _ping(self, after: float) -> float:
        """slurmctld's next ping of every node at or after `after`: every SlurmdTimeout/3, at
        a phase of the trace's own."""
        every = self.delays.slurmd_timeout / 3
        phase = self.chance("ping").uniform(0, every)
        return phase + math.ceil((after - phase) / every) * every

    def _blip(self, f: Fault) -> None:
        """The nodes stop responding now and answer again `f.lasts` later; nothing is broken.
        Slurm sees it only if a ping falls within: then it shows them not responding (`*`)
        until the next ping after they are back, marks none down (that takes SlurmdTimeout)
        and fails no job. SlurmNodeDown fires for those that run a job (`allocated*`)."""
        self.tally.blips += 1
        seen, back = self._ping(self.now), self.now + f.lasts
        if seen >= back:
            return  # back before slurmctld asked
        self.tally.blips_seen += 1
        answered = self._ping(back)
        d = self.delays
        self.later(seen, partial(self._silent, f.nodes, True))
        self.later(answered, partial(self._silent, f.nodes, False))
        for i in f.nodes:
            # The rule needs the state to hold at a scrape and an evaluation, for its `for:`.
            if answered - seen > d.node_down_for + d.scrape + d.evaluation:
                self.later(seen, partial(self._not_responding, self.nodes[i]))

    def _silent(self, nodes: tuple[int, ...], silent: bool) -> None:
        for i in nodes:
            node = self.nodes[i]
            if node.out == "down":
                continue  # down already: Slurm's own story
            node.silent = silent
            if silent:
                node.blipped = self.now
            self._show_node(node)
        if not silent:
            self.place()

    def _not_responding(self, node: SimNode) -> None:
        """SlurmNodeDown for a node shown not responding that runs a job (its status
        `allocated*`; an idle one's `idle*` is not the rule's)."""
        if node.job is None or not node.silent:
            return
        labels = {"node": node.name, "severity": "critical"}
        self._alert(
            self.now,
            self.delays.node_down_for,
            labels | {"alertname": "SlurmNodeDown", "signal": "node_down"},
        )

    def _switch(self, f: Fault) -> None:
        cfg, d, t = self.cfg, self.delays, self.now
        until = t + cfg.switch_repair.total_seconds()
        self.leaf_down_until[f.where] = until
        under = [n for n in self.nodes if n.leaf == f.where]
        if t + d.ib_port_down_for < until:
            for n in under:
                if n.out != "down":
                    self._alert(
                        t,
                        d.ib_port_down_for,
                        {
                            "node": n.name,
                            "severity": "critical",
                            "device": "mlx5_0",
                            "alertname": "NodeInfinibandPortDown",
                            "signal": "network",
                        },
                    )
        hit = [self.jobs[j] for j in sorted({n.job for n in under if n.job is not None})]
        hit = [job for job in hit if job.running and job.stalled is None]
        for job in hit:
            self._hit(job, f)
        self.on_failure(f, hit)

    def _hit(self, job: SimJob, f: Fault) -> None:
        """The failure stops the job's current attempt: at once, or at its collective timeout."""
        t, d = self.now, self.delays
        job.stalled, job.fault = t, f
        self.tally.failures += 1
        attempt = (job.id, job.restarts)
        if f.kind in ("gpu", "app"):
            if f.kind == "app":
                # Every rank alike, or one rank's (its node's traceback; the launcher kills the
                # others), drawn for this crash of this attempt (model.AppEveryRank).
                alike = (
                    self.cfg.app_every_rank.recurs if f.recurs else self.cfg.app_every_rank.cured
                )
                rng = self.chance("every-rank", *attempt)
                one = None if rng.random() < alike else self._crash_node(job, f)
                self._job_alerts(
                    job, t, "TrainingTaskFailed", "app_error", named="failed_at", only=one
                )
            self.later(t + d.crash, lambda: self._ended(attempt, "FAILED"))
        elif f.kind == "node":
            self.later(t + d.slurmd_timeout, lambda: self._ended(attempt, "NODE_FAIL"))
        elif f.kind in ("link", "switch") and d.fabric_error is not None:
            error = t + d.fabric_error  # NCCL's transport gives up on the dead link
            self._job_alerts(job, error, "TrainingNcclError", "nccl_timeout")
            self.later(error + d.crash, lambda: self._ended(attempt, "FAILED"))
        else:  # link, switch, hang: every rank waits in a collective until it times out
            timeout = t + d.collective_timeout
            end = timeout + d.crash
            if t + d.hang_after + d.scrape + d.evaluation < end:
                self._job_alerts(
                    job,
                    t + d.hang_after,
                    "TrainingHang",
                    "hang",
                    stalled_since=str(int(when(t).timestamp())),
                )
            self._job_alerts(job, timeout, "TrainingNcclTimeout", "nccl_timeout")
            self.later(end, lambda: self._ended(attempt, "FAILED"))

    def _ended(self, attempt: tuple[int, int], state: str) -> None:
        job = self.jobs[attempt[0]]
        if job.restarts != attempt[1] or not job.running:
            return  # requeued or stopped meanwhile
        self._end_attempt(job, state)
        # Whatever the policy, the job's owner notices it died and, if it is still down when
        # they look, does the right thing themselves.
        fault = job.fault
        if fault is not None and attempt not in self.person_on:
            self.later(
                self.now + self.person("owner", *attempt),
                lambda: self._owner_looks(job, attempt[1], fault),
            )

    def _owner_looks(self, job: SimJob, attempt: int, fault: Fault) -> None:
        if (job.id, attempt) in self.person_on:
            return  # a person is on it already (no automation, or an escalation)
        if job.restarts == attempt and job.state in ("FAILED", "NODE_FAIL"):
            self.tally.owner_restarts += 1
            self.on_owner(fault, job)

    def _end_attempt(self, job: SimJob, state: str) -> None:
        job.reached = job.resumed + job.saved(self.now, last=True)
        saved = job.saved(self.now)
        job.productive += saved
        self._charge(job, saved)
        job.state, job.ended = state, self.now
        for i in job.nodes:
            self.nodes[i].job = None
            self._show_node(self.nodes[i])
        self._show_job(job)
        self.later(self.now, self.place)

    def _mend_later(self, node: SimNode) -> None:
        assert node.broken is not None
        mend = self.cfg.link_repair if node.broken.kind == "link" else self.cfg.repair
        self.later(self.now + mend.total_seconds(), partial(self._mended, node, node.broken))

    def _mended(self, node: SimNode, fault: Fault) -> None:
        if node.broken is not fault:
            return  # mended already (drained, then marked down by Slurm too)
        node.broken = None
        node.out = ""
        self._show_node(node)
        self.place()

    # ---- what responders do ------------------------------------------------------------
    def drain(self, names: Iterable[str]) -> None:
        for name in names:
            node = self.nodes[self.node_index(name)]
            if node.out:
                continue
            self.tally.drains += 1
            node.out = "drain"
            self._show_node(node)
            if node.broken is not None:
                self._mend_later(node)
            else:  # a person finds nothing wrong and resumes it
                self.tally.healthy_drained += 1
                self.tally.blip_drained += self.now - node.blipped <= BLIP_BLAME
                back = self.now + self.person("resume", node.name, f"{self.now:.0f}")
                self.later(back, partial(self.resume, node))

    def repaired(self, node: SimNode) -> None:
        """A GPU reset or a reboot of the node ran: it mends the node's fault with the model's
        share for its kind (drawn per fault: the same whoever repairs it); a healthy node stays
        healthy. What it does not mend is still there for the health check, and its person's
        mending stays due (`_mend_later`)."""
        self.tally.repairs += 1
        f = node.broken
        if f is None:
            return
        share = self.cfg.repairs.fixes.get(f.kind, 0.0)
        if self.chance("fixes", f"{f.at:.3f}", f.where).random() < share:
            node.broken = None

    def returned(self, node: SimNode) -> bool:
        """slurmedic's repair resumes the node (drained or down, its health check passed)."""
        if not node.out or node.broken is not None:
            return False
        self.tally.repaired += 1
        node.out = ""
        self._show_node(node)
        self.place()
        return True

    def resume(self, node: SimNode) -> None:
        if node.out == "drain" and node.broken is None:
            node.out = ""
            self._show_node(node)
            self.place()

    def requeue(
        self, job: SimJob, exclude: Iterable[str] = (), readmit: Iterable[str] | None = None
    ) -> bool:
        """Requeue the job away from `exclude`: its exclusions replaced (a person, the oracle
        and the naive policy set them), or, with `readmit`, added to what earlier requeues
        excluded less the nodes readmitted (what slurmedic's requeue playbook does)."""
        if job.state in ("PENDING", "CANCELLED"):
            return False
        if job.running and job.fault is None:  # it ran with nothing wrong
            self.tally.needless_requeues += 1
            self.tally.blip_requeues += any(
                self.now - self.nodes[i].blipped <= BLIP_BLAME for i in job.nodes
            )
        if job.running:
            self._end_attempt(job, "REQUEUED")
        self.tally.requeues += 1
        job.restarts += 1
        job.state, job.ended, job.stalled, job.fault = "PENDING", None, None, None
        new = frozenset(self.node_index(n) for n in exclude)
        if readmit is not None:
            new |= job.exclude - {self.node_index(n) for n in readmit}
        job.exclude = new
        self._pend(job)
        return True

    def lift_when_mended(self, job: SimJob, names: Iterable[str]) -> None:
        """Whoever kept the job off a leaf that is down (a person, the oracle) takes that
        exclusion back once the leaf is mended: Slurm would keep it for good."""
        under: dict[float, set[int]] = {}
        for name in names:
            node = self.nodes[self.node_index(name)]
            if self.leaf_down_until[node.leaf] > self.now:
                under.setdefault(self.leaf_down_until[node.leaf], set()).add(node.index)

        def lift(nodes: frozenset[int]) -> None:
            job.exclude -= nodes
            self.place()

        for until, nodes in under.items():
            self.later(until, partial(lift, frozenset(nodes)))

    def _pend(self, job: SimJob) -> None:
        job.not_before = self.now + self.delays.requeue_start
        self._show_job(job)
        self.later(job.not_before, self.place)

    def stop(self, job: SimJob, back: float | None = None) -> bool:
        """Cancel the job; its owner submits it again when they have looked (and fixed a bug
        that recurs), or at `back`."""
        if job.state in ("PENDING", "CANCELLED"):
            return False
        recurs = job.fixed_at is not None and job.fixed_at > self.now
        self.tally.stops += 1
        self.tally.needless_stops += not recurs
        if job.running:
            self._end_attempt(job, "CANCELLED")
        job.state = "CANCELLED"
        self._show_job(job)
        if back is None:
            back = max(self.now + self.person("stop", job.id, job.restarts), job.fixed_at or 0.0)
        self.later(back, lambda: self._resubmit(job))
        return True

    def _resubmit(self, job: SimJob) -> None:
        if job.state == "CANCELLED":
            job.restarts += 1
            job.state, job.ended, job.stalled, job.fault = "PENDING", None, None, None
            job.exclude = frozenset()
            self._pend(job)

    # ---- scheduling --------------------------------------------------------------------
    def known_bad(self) -> list[str]:
        """What someone who knows the truth keeps a job away from: broken nodes still in
        service, and the nodes under a leaf that is down."""
        return [
            n.name
            for n in self.nodes
            if (n.broken is not None and not n.out) or self.leaf_down_until[n.leaf] > self.now
        ]

    def mended_by(self) -> float:
        """When the last leaf that is down now is mended (now, when none is)."""
        return max([self.now, *self.leaf_down_until])

    def fits_without(self, job: SimJob, names: Iterable[str]) -> bool:
        """Whether the job's next attempt could start now away from these nodes."""
        away = {self.node_index(n) for n in names}
        free = sum(
            1 for n in self.nodes if not n.out and n.index not in away and n.job in (None, job.id)
        )
        return free >= job.cls.nodes

    def place(self) -> None:
        """Start every pending job that fits: on its last nodes first, then the lowest free
        ones (a leaf at a time, as a topology-aware scheduler would)."""
        for job in self.jobs.values():
            if job.state != "PENDING" or job.not_before > self.now:
                continue
            usable = self.idle - job.exclude
            if len(usable) < job.cls.nodes:
                continue  # the common case while nodes are out: no scan of the cluster
            chosen = [i for i in job.nodes if i in usable]
            if len(chosen) < job.cls.nodes:
                rest = sorted(usable.difference(chosen))
                chosen += rest[: job.cls.nodes - len(chosen)]
            self._start(job, chosen[: job.cls.nodes])

    def _charge(self, job: SimJob, saved: float, *, ended: bool = True) -> None:
        """The attempt ends now: what it did not save is charged to the fault that ended it,
        or, when none did, to the one it answers for."""
        if job.fault is not None:
            job.cause = job.fault.kind
        elif ended:
            job.cause = NEEDLESS  # requeued or stopped with nothing wrong
        lost = (self.now - job.started) * job.share - saved
        if job.attempts == 1:  # the ideal run starts the job once too
            lost -= job.cls.restart.total_seconds() * job.share
        self._lose(job, lost * job.gpus)
        job.idle_since = self.now

    def _lose(self, job: SimJob, gpu_seconds: float) -> None:
        self.tally.lost[job.cause] = self.tally.lost.get(job.cause, 0.0) + gpu_seconds

    def _waited(self, job: SimJob) -> float:
        """GPU-seconds of training the job has lost waiting since its last attempt ended."""
        return (self.now - job.idle_since) * job.share * job.gpus

    def _start(self, job: SimJob, nodes: list[int]) -> None:
        self._lose(job, self._waited(job))
        job.nodes, job.state, job.started, job.ended = nodes, "RUNNING", self.now, None
        job.stalled, job.fault, job.resumed = None, None, job.productive
        job.attempts += 1
        for i in nodes:
            self.nodes[i].job = job.id
            self._show_node(self.nodes[i])
        self._show_job(job)
        attempt = (job.id, job.restarts)
        d, rng = self.delays, self.chance("start", *attempt)
        # What is still wrong where it landed shows again within minutes.
        for i in nodes:
            node = self.nodes[i]
            if node.broken is not None:
                f = node.broken
                shows = self.now + rng.uniform(60, d.recur_within)
                again = Fault(shows, f.kind, i, gpu=f.gpu, xid=f.xid)
                self.later(again.at, partial(self._recur, attempt, again))
                break
        down = {
            self.nodes[i].leaf for i in nodes if self.leaf_down_until[self.nodes[i].leaf] > self.now
        }
        if down:
            leaf = min(down)
            self.later(self.now, lambda: self._recur(attempt, Fault(self.now, "switch", leaf)))
        if job.fixed_at is not None and job.fixed_at > self.now:
            at = self.now + job.cls.restart.total_seconds() + rng.uniform(0, d.recur_within)
            self.later(at, lambda: self._recur(attempt, Fault(at, "app", nodes[0], recurs=True)))

    def _recur(self, attempt: tuple[int, int], f: Fault) -> None:
        job = self.jobs[attempt[0]]
        if job.restarts != attempt[1] or not job.running or job.stalled is not None:
            return
        if f.kind == "app" and (job.fixed_at is None or job.started >= job.fixed_at):
            return  # an attempt runs the code it started with: fixed only if it started after
        if f.kind in ("app", "switch"):
            self._hit(job, f)
            self.on_failure(f, [job])
        elif self.nodes[f.where].broken is not None:
            self._manifest(f)

    # ---- the end -----------------------------------------------------------------------
    def close(self) -> None:
        """The span ends: credit what every running attempt trained."""
        self._count_out()
        for job in self.jobs.values():
            if job.running:  # a stalled attempt still loses what it had not checkpointed
                saved = job.saved(self.now, last=job.stalled is None)
                job.productive += saved
                self._charge(job, saved, ended=False)
                job.state = "ENDED"
            else:  # still waiting: charged up to the end
                waited = self._waited(job)
                if job.attempts == 0:  # never started: the ideal run's start-up is not lost
                    waited -= job.cls.restart.total_seconds() * job.share * job.gpus
                self._lose(job, waited)
