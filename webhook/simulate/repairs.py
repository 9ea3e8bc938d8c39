"""slurmedic's repair loop on the simulated cluster: the real core (webhook.core.repairs) decides
each node's plan and every step, as the live loop (webhook.service.loop) runs it; the world
carries the steps out in the model's time (model.Repairs) and says what each mended.

A node slurmedic drained for its own fault is taken up at its drain; once no job runs on it,
the core resets its GPUs or reboots it, checks it and resumes it, or sends it to a person for
replacement (its fault has no automatic repair, it failed again after a repair, its budget is
spent, its check failed, it did not come back from its reboot). A node sent to a person waits
for the model's human mending, as without the loop."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta

from webhook.core import repairs
from webhook.core.alerts import Alert
from webhook.core.cluster import Node
from webhook.core.decisions import DRAIN_CAUSES, Decision
from webhook.core.incidents import REASON
from webhook.core.lifecycle import EXECUTED
from webhook.core.policy import Policy
from webhook.core.validation import is_number
from webhook.simulate.world import PARTITION, World, when

# How many times one look moves the repairs at most: a step that is done at once (the resume)
# lets its repair move again in the same look.
PASSES = 4


class RepairLoop:
    def __init__(self, world: World, policy: Policy) -> None:
        self.world = world
        self.policy = policy
        self.history: dict[str, list[repairs.Repair]] = {}  # each node's, oldest first
        self.active: dict[str, repairs.Repair] = {}  # each node's repair not closed
        self.drains = itertools.count(1)
        self.steps = itertools.count(1)
        # The XIDs of the alerts that carry one, by fingerprint: what the ledger reads back
        # from a drain's evidence.
        self.xids: dict[str, int] = {}
        self.rebooting: set[str] = set()
        # The reason Slurm shows for each node slurmedic took out of service: its drain's, then
        # its reboot's (the core counts a reboot done once the node shows it).
        self.reasons: dict[str, str] = {}

    def heard(self, alert: Alert) -> None:
        xid = alert.labels.get("xid", "")
        if is_number(xid):
            self.xids[alert.fingerprint] = int(xid)

    def drained(self, d: Decision) -> None:
        """slurmedic's drain was carried out: each node's repair begins (live: the loop's next
        look at new drains)."""
        if d.cause not in DRAIN_CAUSES:
            return
        now = when(self.world.now)
        for name in d.nodes:
            alerts = tuple(
                (str(e.get("alertname", "")), self.xids.get(str(e.get("fingerprint", ""))))
                for e in d.evidence
                if e.get("fingerprint") and e.get("node") in (name, None)
            )
            drained = repairs.Drained(
                name, next(self.drains), d.incident, d.cause, now, True, alerts, PARTITION
            )
            self.reasons[name] = f"{REASON}{d.incident} {d.cause}"
            mine = self.history.setdefault(name, [])
            current = self.active.get(name)
            if current is not None and current.state != repairs.PROBATION:
                continue  # its repair under way covers this drain too (repairs.folded)
            if current is not None:
                self._move(current, repairs.failed_on_probation(current))
            repair, move = repairs.begin(drained, len(mine) + 1, list(mine), self.policy, now)
            mine.append(repair)
            self.active[name] = repair
            if move is not None:
                self._move(repair, move)
        self.advance()

    def advance(self) -> None:
        """Every repair under way moved on the cluster as it is now (the live loop's look)."""
        for _ in range(PASSES):
            now = when(self.world.now)
            found = list(self.active.values())
            busy = sum(r.state in repairs.IN_REPAIR for r in found)
            moved = False
            for repair in found:
                mine = repair.state in repairs.IN_REPAIR
                move = repairs.advance(
                    repair, self._node(repair.node), self.policy, now, busy - mine
                )
                if move is None:
                    continue
                self._move(repair, move)
                busy += (move.state in repairs.IN_REPAIR) - mine
                moved = True
            if not moved:
                return

    def _node(self, name: str) -> Node:
        """The node as Slurm shows it to the loop: drained or draining, down, not responding
        (`*`) while its host is dead, rebooting while its reboot runs, with slurmedic's reason
        while it is out of service."""
        w = self.world
        n = w.nodes[w.node_index(name)]
        if n.out == "down":
            status = "down"
        elif n.out == "drain":
            status = "draining" if n.job is not None else "drained"
        else:
            status = "allocated" if n.job is not None else "idle"
        dead = n.broken is not None and n.broken.kind == "node"
        if dead or n.silent:
            status += "*"
        return replace(
            w.view.nodes[name],
            status=status,
            reason=self.reasons.get(name, f"{REASON}sim") if n.out else "",
            rebooting=name in self.rebooting,
        )

    def _move(self, repair: repairs.Repair, move: repairs.Move) -> None:
        now = when(self.world.now)
        moved = repair.moved(move.state, now)
        d = move.decision
        step = None
        if d is not None:
            step = repairs.Step(next(self.steps), d.action, d.state, now)
            moved = replace(moved, steps=(*moved.steps, step))
        self._keep(moved)
        if move.state == repairs.REPLACE and d is not None:
            # A person is asked to replace it (a failure on probation only closes the repair:
            # the new drain's repair asks).
            self.world.tally.replaced += 1
        if step is not None:
            self._run(moved, step)

    def _keep(self, repair: repairs.Repair) -> None:
        mine = self.history[repair.node]
        mine[[r.seq for r in mine].index(repair.seq)] = repair
        if repair.state in repairs.CLOSED:
            self.active.pop(repair.node, None)
        else:
            self.active[repair.node] = repair

    def _run(self, repair: repairs.Repair, step: repairs.Step) -> None:
        """Carry a step out, in the model's time for it."""
        w, times, name = self.world, self.world.cfg.repairs, repair.node
        node = w.nodes[w.node_index(name)]
        if step.action == "resume":
            self._done(name, step, passed=None)
            w.returned(node)
            return
        took: timedelta | None = {
            "reset_gpu": times.reset_gpu,
            "reboot": times.reboot,
            "health_check": times.health_check,
        }.get(step.action)
        if took is None:
            return  # an escalation: the person's mending is already due
        if step.action == "reboot":
            # The reboot playbook's reason (`scontrol reboot ASAP nextstate=DOWN reason=...`).
            self.rebooting.add(name)
            self.reasons[name] = f"{REASON}{repair.key} reboot"
        at = w.now + took.total_seconds()

        def finish() -> None:
            passed = None
            if step.action in repairs.NODE_STEPS:
                self.rebooting.discard(name)
                w.repaired(node)
            else:
                passed = node.broken is None
            self._done(name, step, passed=passed)
            self.advance()
            if step.action == "reboot":
                # A node that did not come back is the core's to give up on after its timeout.
                wait = self.policy.repairs.reboot_timeout.total_seconds() + 1
                w.later(w.now + wait, self.advance)

        w.later(at, finish)

    def _done(self, name: str, step: repairs.Step, *, passed: bool | None) -> None:
        repair = self.active.get(name)
        if repair is None or step not in repair.steps:
            return  # its repair ended meanwhile (a person took the node over)
        ran = replace(step, state=EXECUTED, done_at=when(self.world.now), passed=passed)
        steps = tuple(ran if s.id == step.id else s for s in repair.steps)
        self._keep(replace(repair, steps=steps))
