"""The notifier: slurmedic's notices (webhook/core/notices.py) posted to Alertmanager.

Every `interval` the open notices are posted again, each firing until a little past the next
post (so a notifier that stops lets them resolve by themselves, and a restarted one needs no
memory); a notice that is no longer open is posted once more, resolved. A failed post is
logged and made again on the next round: a notice is late, never lost while it is open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from webhook.adapters.alertmanager import AlertmanagerError, post_alerts
from webhook.core.notices import Notice, as_alert, notices
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

    def step(self) -> None:
        if time.monotonic() - self.last < self.interval:
            return
        self.last = time.monotonic()
        now = self.clock()
        current = {n.key: n for n in notices(review.needs_human(self.ledger, now - self.lookback))}
        gone = [n for k, n in self.posted.items() if k not in current]
        alerts = [as_alert(n, now, self.ends, self.console_url) for n in current.values()]
        alerts += [as_alert(n, now, timedelta(0), self.console_url) for n in gone]
        try:
            self.post(self.url, alerts)
        except AlertmanagerError as e:
            log.warning("notices not posted (%d open): %s; trying again", len(current), e)
            return
        self.posted = current
