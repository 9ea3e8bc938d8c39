"""The job-side progress reporter, under its old name.

It lives in its own distribution (`reporter/`, `slurmedic-progress`, standard library only), so
that training jobs install it without slurmedic's service; slurmedic depends on it.
"""

from slurmedic_progress import GAUGES, PUSH_JOB, ProgressReporter

__all__ = ["GAUGES", "PUSH_JOB", "ProgressReporter"]
