"""The fence: until when this replica's playbook runs may act on Slurm.

The lease fences the ledger (a claim names its term), but Slurm takes no token: a leader paused
between a playbook's read and its act would act on a stale read once it wakes, after another
replica has taken over and acted. So each replica keeps one small file saying until when
(epoch seconds) its lease surely holds: each renewal moves it on to the local time taken
*before* the renewal's statement plus the lease, less a margin for the clocks of the hosts its
playbooks run on; a term that ends writes 0. Every act of a playbook reads it (the playbooks'
`slurmedic_not_after`) and runs only before that time (playbooks/library/slurmedic_act.py).

Written in place, at a fixed width: a full disk does not stop a renewal from moving it on.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("slurmedic.fence")
WIDTH = 20  # characters: "%20.3f" of any epoch time, read back whole


class Fence:
    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            fd, name = tempfile.mkstemp(prefix="slurmedic-fence-")
            path = Path(name)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.path, self.fd = path, fd
        self.until = 0.0
        self._write(0.0)

    def _write(self, until: float) -> None:
        os.pwrite(self.fd, f"{until:{WIDTH}.3f}".encode(), 0)
        self.until = until

    def extend(self, until: float) -> None:
        """Acts are allowed until `until` (never moved back by a renewal that was slower)."""
        if until <= self.until:
            return
        try:
            self._write(until)
        except OSError as e:  # the old time stands and runs out: acts stop, nothing worse
            log.error("the fence could not be moved on: %s", e)

    def revoke(self) -> None:
        """The term ended: no act from now on."""
        try:
            self._write(0.0)
        except OSError as e:  # the time it holds runs out within a lease all the same
            log.error("the fence could not be revoked: %s", e)

    def read(self) -> float:
        return float(os.pread(self.fd, WIDTH, 0))

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)
