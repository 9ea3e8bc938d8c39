"""Whether this host can run a playbook now: a replica that cannot (its disk full) does not
lead (webhook/service/leadership.py), and its /readyz says why. Without ansible-runner, so the
web app can ask too."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

# A run writes its extra vars and ansible-runner's artifacts (tens of KB) in a temp dir: the
# probe asks for more than that, so a host that passes it can start a run.
PROBE_BYTES = 64 * 1024


def unfit_to_run() -> str | None:
    """Why this host cannot start a playbook run now, or None: a temp dir and a file of a run's
    size, written and removed."""
    try:
        d = tempfile.mkdtemp(prefix="slurmedic-probe-")
        try:
            (Path(d) / "probe").write_bytes(bytes(PROBE_BYTES))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    except OSError as e:
        return f"cannot write in {tempfile.gettempdir()}: {e.strerror or e}"
    return None
