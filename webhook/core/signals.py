"""The `signal` vocabulary: the label every alert meant for slurmedic carries, and what each
value is evidence of. This is the one list. The core derives its sets from it, and the tests
hold the rule files and Alertmanager's route to it, so a new alert with an existing signal needs
nothing here or anywhere else in the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    HARDWARE = "hardware"  # evidence against a node itself (attribution rule 1)
    # The node still works but should leave service when convenient: corrected errors rising,
    # a row remap pending, a contained error. Its job is left running unless it fails there.
    DEGRADED = "degraded"
    APPLICATION = "application"  # the application's fault, unless hardware says otherwise
    TIMEOUT = "timeout"  # a rank waited for a peer: names the waiter, not the culprit
    HANG = "hang"  # the job stopped making progress
    STRAGGLER = "straggler"  # a node persistently slower than its peers


@dataclass(frozen=True)
class Signal:
    name: str
    kind: Kind
    cause: str = ""  # hardware and degraded: the cause it points to
    # Evidence that the job has failed, not only shown a symptom (a fatal error, a stall): an
    # application XID is a symptom the job may well survive.
    failed: bool = False


# Within a kind, strongest first: the first hardware signal of an incident names its cause.
VOCABULARY = (
    Signal("gpu_hw", Kind.HARDWARE, cause="gpu_hardware"),
    Signal("node_down", Kind.HARDWARE, cause="node_failure"),
    Signal("network", Kind.HARDWARE, cause="network"),
    Signal("gpu_degraded", Kind.DEGRADED, cause="degraded"),
    Signal("gpu_app", Kind.APPLICATION),
    Signal("app_error", Kind.APPLICATION, failed=True),
    Signal("nccl_timeout", Kind.TIMEOUT),
    Signal("hang", Kind.HANG, failed=True),
    Signal("straggler", Kind.STRAGGLER),
)


def of_kind(*kinds: Kind) -> tuple[str, ...]:
    """The signals of these kinds, in the vocabulary's order (strongest first)."""
    return tuple(s.name for s in VOCABULARY if s.kind in kinds)


SIGNALS = frozenset(s.name for s in VOCABULARY)
# Hardware signal to the cause it points to, strongest first.
HARDWARE = {s.name: s.cause for s in VOCABULARY if s.kind is Kind.HARDWARE}
DEGRADED = of_kind(Kind.DEGRADED)
APPLICATION = of_kind(Kind.APPLICATION)
TIMEOUT = of_kind(Kind.TIMEOUT)
HANG = of_kind(Kind.HANG)
STRAGGLER = of_kind(Kind.STRAGGLER)
# A node that cannot be reached (it stopped answering, its fabric port is down): what a blip of
# the controller's or the fabric's network gives many nodes at once (rule 5's bursts). A GPU's
# own fault is its own.
UNREACHABLE = frozenset(s for s, cause in HARDWARE.items() if cause in ("node_failure", "network"))
# Evidence against a node itself, whatever its job does: a failure of the node when it runs no
# job, and news for a job that died on it before the alert fired.
AGAINST_NODE = frozenset((*HARDWARE, *DEGRADED))
# Evidence that can only say "the job stalled": it names no node by itself.
STALL = frozenset((*HANG, *TIMEOUT))
FAILURE_SIGNALS = frozenset(s.name for s in VOCABULARY if s.failed)
