"""One replica's loop process: it follows until it holds the leader's lease, then leads.

Every replica's webhook stores what Alertmanager delivers; only the leader decides and
executes. A follower's ledger carries a term that is never current, so nothing it (or a run
its last term left behind) tries to claim succeeds. Each round a replica renews its term
(or, as a follower, tries to take the lease once the leader's has expired) and beats; a
leader then steps its LiveLoop. A term that ends (renewal refused, the ledger unreachable, a
claim refused: LostLease) drops the loop with everything it held in memory; a later term
builds a new one from the ledger, as a restart does, and picks up the runs the old leader
left `running` (the playbooks are idempotent).

The lease fences the ledger; the replica's fence (webhook/executor/fence.py) carries it to
Slurm: each renewal moves it on, an ended term revokes it, and its playbooks act only before it
runs out.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from webhook.executor.fence import Fence
from webhook.executor.fitness import unfit_to_run
from webhook.ledger.leases import LostLease, Term
from webhook.ledger.settings import CorruptSetting
from webhook.ledger.store import Ledger, Unavailable
from webhook.service.loop import LiveLoop

log = logging.getLogger("slurmedic.leadership")


class Replica:
    """`make_loop(ledger)` builds a term's loop on the ledger fenced by that term
    (`Ledger.fenced`): its executor's and verifier's writes too, so a run an ended term left
    in flight can claim nothing, even once this process leads again in a later term."""

    def __init__(
        self,
        ledger: Ledger,
        name: str,
        make_loop: Callable[[Ledger], LiveLoop],
        *,
        lease_seconds: float = 15.0,
        fitness: Callable[[], str | None] = unfit_to_run,
        fence: Fence | None = None,
    ) -> None:
        self.ledger, self.name, self.make_loop = ledger, name, make_loop
        self.lease_seconds = lease_seconds
        self.fence = fence
        # What the fence keeps back from the lease: the clocks of the hosts the playbooks run
        # on may be this far ahead of this one's.
        self.fence_margin = lease_seconds / 5
        # Why this host cannot run playbooks now (its disk full), or None: a replica that
        # cannot carry out decisions does not lead, so one that can takes over.
        self.fitness = fitness
        self.unfit: str | None = None
        self.benched: tuple[str, float] | None = None  # a run's CannotRun, and until when
        self.term: Term | None = None
        self.ledger.term = self.none
        self.loop: LiveLoop | None = None
        self.halted = threading.Event()
        self.finished = threading.Event()
        # A step may outlast the lease (a Slurm that takes its timeouts to answer): a thread
        # renews the term meanwhile, up to `step_limit`; a step stuck longer lets it lapse,
        # and a follower takes over. A clean stop is renewed until its runs have finished.
        self.lock = threading.Lock()
        self.busy_since: float | None = None
        self.step_limit = 4 * lease_seconds
        threading.Thread(target=self._keep_alive, name="lease", daemon=True).start()

    @property
    def none(self) -> Term:
        """The term of a follower: token 0 is never a lease's, so it claims nothing."""
        return Term(self.name, 0)

    def _keep_alive(self) -> None:
        while not self.finished.wait(self.lease_seconds / 4):
            with self.lock:
                started, term = self.busy_since, self.term
                if started is None or term is None:
                    continue  # between steps the round renews the term itself
                if time.monotonic() - started > self.step_limit:
                    log.error("busy for over %.0f s: the lease lapses", self.step_limit)
                    continue
                try:
                    asked = time.time()
                    if self.ledger.leases.renew(term, self.lease_seconds):
                        self._fence_until(asked)
                        self.ledger.leases.beat(self.name, loop=True, leading=True)
                except SQLAlchemyError as e:
                    log.error("renewing the lease failed: %s", str(e).splitlines()[0])

    def round(self) -> None:
        """Hold the lease (or try to), beat, and step the loop while leading."""
        dispatcher = self.loop.dispatcher if self.loop is not None else None
        if dispatcher is not None and dispatcher.unfit is not None:
            # A run failed to start though the probe passed (another directory full): stand
            # aside for two leases, so a replica that can run takes over.
            self.benched = (dispatcher.unfit, time.monotonic() + 2 * self.lease_seconds)
        unfit = self.fitness()
        if unfit is None and self.benched is not None:
            unfit = self.benched[0] if time.monotonic() < self.benched[1] else None
        if unfit != self.unfit:
            if unfit is None:
                log.info("%s can run playbooks again", self.name)
            else:
                log.error("%s cannot run playbooks (%s): not leading", self.name, unfit)
            self.unfit = unfit
        term: Term | None = None
        asked = time.time()
        # A leader that cannot run playbooks any more, with runs in flight: they finish under
        # its term (released now, the next leader would run them again beside them). It
        # starts nothing new, and ends its term once they have.
        winding_down = unfit is not None and dispatcher is not None and dispatcher.in_flight()
        if unfit is None or winding_down:
            try:
                term = self.ledger.leases.hold(self.name, self.term, self.lease_seconds)
            except (SQLAlchemyError, Unavailable) as e:
                # Unreachable: the term cannot be renewed, so it must be treated as ending now.
                log.error("the ledger did not answer (%s): not leading", str(e).splitlines()[0])
        if winding_down and dispatcher is not None and term is not None and term == self.term:
            self._fence_until(asked)  # its runs in flight act under the term they began in
            dispatcher.abandon()
            with contextlib.suppress(SQLAlchemyError):
                self.ledger.leases.beat(self.name, loop=True, leading=True)
            return
        if term != self.term:
            if self.term is not None:
                self._drop(f"cannot run playbooks: {unfit}" if unfit else "its term ended")
            with self.lock:
                self.term = term
            if term is not None:
                log.info("%s leads (term %d)", self.name, term.token)
        if term is not None:
            self._fence_until(asked)
        try:
            self.ledger.leases.beat(self.name, loop=True, leading=term is not None)
        except SQLAlchemyError as e:
            log.error("beat failed: %s", str(e).splitlines()[0])
        if term is None:
            return
        with self.lock:
            self.busy_since = time.monotonic()  # building the loop reads Slurm too
        try:
            if self.loop is None:
                # A corrupt setting read at start (the breaker) ends the loop, naming it: a
                # human mends it, and serve starts the loop again.
                self.loop = self.make_loop(self.ledger.fenced(term))
                if self.halted.is_set():
                    self.loop.stopping.set()
            self.loop.step()
        except LostLease as e:
            log.warning("%s: %s; following", self.name, e)
            self._drop(str(e))
        except CorruptSetting as e:
            if self.loop is None:
                raise
            log.error("loop step failed: %s", e)  # a human can mend it: say which, briefly
        except Exception:
            log.exception("loop step failed; retrying")
        finally:
            with self.lock:
                self.busy_since = None

    def _fence_until(self, asked: float) -> None:
        """The term was renewed (or taken) by a statement sent after `asked` (this host's
        clock): the database set its end a lease after, at the earliest."""
        if self.fence is not None:
            self.fence.extend(asked + self.lease_seconds - self.fence_margin)

    def _revoke(self) -> None:
        if self.fence is not None:
            self.fence.revoke()

    def _drop(self, why: str) -> None:
        """Forget the loop of a term that ended, and end the term (a follower need not wait
        for it to expire when it was still running); runs the loop started finish (a playbook
        is not cut off half-way), but it starts none, and its writes are refused."""
        with self.lock:
            term, self.term = self.term, None
            self._revoke()  # first: a run in flight acts on nothing from now on
        if self.loop is not None:
            log.warning("%s stops leading (%s): the loop is dropped", self.name, why)
            self.loop.stopping.set()
            if self.loop.dispatcher is not None:
                self.loop.dispatcher.abandon()
        self.loop = None
        if term is not None:
            with contextlib.suppress(SQLAlchemyError):
                self.ledger.leases.release(term)

    def halt(self) -> None:
        """Told to stop (a signal, serve gone): the loop decides and starts nothing more."""
        self.halted.set()
        if self.loop is not None:
            self.loop.stopping.set()

    def run(self, tick_seconds: float = 1.0) -> None:
        while not self.halted.is_set():
            self.round()
            pause = self.loop.pause(tick_seconds) if self.loop is not None else tick_seconds
            self.halted.wait(pause)
        self.stop()

    def stop(self) -> None:
        """A clean stop: the runs in flight finish, the term renewed meanwhile; then it ends at
        once (a follower need not wait for it to expire)."""
        with self.lock:
            self.busy_since = time.monotonic()
        if self.loop is not None and self.loop.dispatcher is not None:
            self.loop.dispatcher.close()
        with self.lock:
            term, self.term, self.busy_since = self.term, None, None
            self._revoke()
        self.finished.set()
        if term is not None:
            try:
                self.ledger.leases.release(term)
            except SQLAlchemyError as e:
                log.error("releasing the lease failed: %s", str(e).splitlines()[0])
        with contextlib.suppress(SQLAlchemyError):
            self.ledger.leases.beat(self.name, loop=True, leading=False)
