"""The notifier: slurmedic's notices (webhook/core/notices.py) posted to Alertmanager.

Every `interval` the open notices are posted again, each firing until a little past the next
post (so a notifier that stops lets them resolve by themselves, and a restarted one needs no
memory); a notice that is no longer open is posted once more, resolved. A failed post is
logged and made again on the next round: a notice is late, never lost while it is open.

The loop hands each round its cluster view's jobs: the owner of a notice's job is read there
and recorded on the decision the first time (review.record_owner), so the notice keeps the same
labels after Slurm forgets the job and after a restart. A notice whose labels change anyway (its
job's owner learnt after a first post without it) is resolved under its old labels.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from webhook.adapters.alertmanager import AlertmanagerError, post_alerts
from webhook.core.cluster import Job
from webhook.core.notices import Notice, as_alert, labels, learnt, notices
from webhook.ledger import review
from webhook.ledger.store import Ledger

log = logging.getLogger("slurmedic.notify")


class Notifier:
    def __init__(
        self,
        ledger: Ledger,
        alertmanager_url: str,
        *,
        console_url: str = "",
        interval: float = 15.0,
        lookback: timedelta = timedelta(days=7),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        post: Callable[[str, list[dict[str, Any]]], None] = post_alerts,
    ) -> None:
        self.ledger, self.url, self.console_url = ledger, alertmanager_url, console_url
        self.interval, self.lookback, self.clock, self.post = interval, lookback, clock, post
        # Firing until past the next two posts: one lost post does not resolve a notice.
        self.ends = timedelta(seconds=max(3 * interval, 60.0))
        self.posted: dict[tuple[str, int], Notice] = {}
        self.last = float("-inf")

    def step(self, jobs: Mapping[int, Job] | None = None) -> None:
        """Post the open notices (and the resolved ones) if `interval` has passed; `jobs`: the
        cluster view's, whose owners the notices name."""
        if time.monotonic() - self.last < self.interval:
            return
        self.last = time.monotonic()
        now, jobs = self.clock(), jobs or {}
        rows = review.needs_human(self.ledger, now - self.lookback)
        for decision_id, owner in learnt(rows, jobs).items():
            for problem in owner.problems():
                log.warning("decision %d: %s", decision_id, problem)
            review.record_owner(self.ledger, decision_id, owner, now)
        current = {n.key: n for n in notices(rows, now, jobs)}
        gone = [
            n for k, n in self.posted.items() if k not in current or labels(current[k]) != labels(n)
        ]
        alerts = [as_alert(n, now, timedelta(0), self.console_url) for n in gone]
        alerts += [as_alert(n, now, self.ends, self.console_url) for n in current.values()]
        try:
            self.post(self.url, alerts)
        except AlertmanagerError as e:
            log.warning("notices not posted (%d open): %s; trying again", len(current), e)
            return
        self.posted = current
