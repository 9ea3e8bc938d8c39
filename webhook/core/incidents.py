"""Incident keys: the one definition of what an incident is called, in the ledger and in Slurm.

An incident is one failure of one job attempt (`1001.0`: job 1001, restart count 0), the n-th
failure of an idle node (`node:gpu02`, then `node:gpu02:2`, ...), the verifier's judgement of a
requeued attempt (`verify:1001.0`), an operator's recovery drill of an attempt (`drill:1001.0`),
the n-th repair of a node slurmedic drained (`repair:gpu02`, then `repair:gpu02:2`, ...), or a
human's return of nodes to service (`resume:gpu[01-02]`).
The key reaches Slurm in a drain reason (`slurmedic: node:gpu02:2 gpu_hardware`, built here:
`drain_reason`), so every key a drain can carry is made of characters a reason may hold:
letters, digits and `:._-` (a resume's `[],+` never reach a reason: nothing drains for one).

Lengths: a node name is at most 64 characters (HOST_NAME_MAX), so the longest key a playbook
sees is a node's n-th repair, `repair:` + 64 + `:` + 6 digits = 78, the bound of the
playbooks' incident pattern (playbooks/vars/slurmedic.yml says how each bound follows from the
last). A resume's key is kept within MAX_LEN, what the ledger's columns hold.

Every consumer (engine, executor, verifier, CLI) builds and reads keys here; nothing else splits
them. Ledgers written before this module may hold `node:gpu02#2`: it is read as `node:gpu02:2`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

import hostlist

from webhook.core.patterns import DRAIN_REASON, NODE_NAME

Kind = Literal["attempt", "node", "verify", "drill", "repair", "resume"]
_ATTEMPT = re.compile(r"^([0-9]{1,10})\.([0-9]{1,6})\Z")  # \Z: no trailing newline
# A node name holds no `:` or `#`; what it may hold is NODE_NAME's to say (of_node checks).
_NODE = re.compile(r"^node:([^:#\n]+)(?:[:#]([0-9]{1,6}))?\Z")
_REPAIR = re.compile(r"^repair:([^:#\n]+)(?::([0-9]{1,6}))?\Z")
# The longest key of any kind, what the ledger's incident columns hold (webhook/ledger/schema.py):
# the playbooks' 78 (a node's repair) and a resume of many long names (at most 82 + the digits
# of its count, below).
MAX_LEN = 128
VERIFY = "verify:"  # the prefix of the verifier's keys (the ledger selects them by it)
RESUME = "resume:"  # the prefix of a human's resumes (`slurmedic resume`)
DRILL = "drill:"  # the prefix of an operator's recovery drills (`slurmedic drill`)
REPAIR = "repair:"  # the prefix of the repairs of nodes slurmedic drained
REASON = "slurmedic: "  # how a drain's reason starts: the nodes slurmedic drained, and may resume


class BadIncidentKey(ValueError):
    """A string that is no incident key."""


@dataclass(frozen=True)
class IncidentKey:
    kind: Kind
    job: int | None = None
    attempt: int | None = None
    node: str | None = None
    seq: int = 1  # the n-th failure of an idle node, the n-th repair of a node
    nodes: tuple[str, ...] = ()  # resume

    # ---- constructors ------------------------------------------------------------------
    @classmethod
    def of_attempt(cls, job: int, attempt: int) -> IncidentKey:
        return cls("attempt", job=job, attempt=attempt)

    @classmethod
    def of_node(cls, node: str, seq: int = 1) -> IncidentKey:
        if not NODE_NAME.match(node):
            raise BadIncidentKey(f"{node[:80]!r} is not a node name")
        return cls("node", node=node, seq=seq)

    @classmethod
    def verifying(cls, job: int, attempt: int) -> IncidentKey:
        return cls("verify", job=job, attempt=attempt)

    @classmethod
    def drilling(cls, job: int, attempt: int) -> IncidentKey:
        return cls("drill", job=job, attempt=attempt)

    @classmethod
    def repairing(cls, node: str, seq: int = 1) -> IncidentKey:
        if not NODE_NAME.match(node):
            raise BadIncidentKey(f"{node[:80]!r} is not a node name")
        return cls("repair", node=node, seq=seq)

    @classmethod
    def resuming(cls, nodes: tuple[str, ...]) -> IncidentKey:
        return cls("resume", nodes=tuple(sorted(set(nodes))))

    # ---- encode / decode ---------------------------------------------------------------
    def __str__(self) -> str:
        if self.kind == "attempt":
            return f"{self.job}.{self.attempt}"
        if self.kind == "verify":
            return f"{VERIFY}{self.job}.{self.attempt}"
        if self.kind == "drill":
            return f"{DRILL}{self.job}.{self.attempt}"
        if self.kind in ("node", "repair"):
            prefix = REPAIR if self.kind == "repair" else "node:"
            return f"{prefix}{self.node}" if self.seq == 1 else f"{prefix}{self.node}:{self.seq}"
        key = f"{RESUME}{hostlist.collect_hostlist(list(self.nodes))}"
        if len(key) <= MAX_LEN:
            return key
        # Too many names to list, or too long ones: the first and how many more, for people,
        # and a digest of them all, so that two resumes of different nodes never share a key.
        digest = hashlib.sha256(",".join(self.nodes).encode()).hexdigest()[:8]
        return f"{RESUME}{self.nodes[0]},+{len(self.nodes) - 1}:{digest}"

    @classmethod
    def parse(cls, text: str) -> IncidentKey:
        if m := _ATTEMPT.match(text):
            return cls.of_attempt(int(m[1]), int(m[2]))
        if text.startswith(VERIFY) and (m := _ATTEMPT.match(text.removeprefix(VERIFY))):
            return cls.verifying(int(m[1]), int(m[2]))
        if text.startswith(DRILL) and (m := _ATTEMPT.match(text.removeprefix(DRILL))):
            return cls.drilling(int(m[1]), int(m[2]))
        if m := _NODE.match(text):
            return cls.of_node(m[1], int(m[2] or 1))
        if m := _REPAIR.match(text):
            return cls.repairing(m[1], int(m[2] or 1))
        if text.startswith(RESUME):
            rest = text.removeprefix(RESUME)
            try:
                nodes = hostlist.expand_hostlist(rest.split(",+")[0])
            except hostlist.BadHostlist as e:
                raise BadIncidentKey(f"{text[:80]!r} is not an incident key") from e
            return cls.resuming(tuple(nodes))
        raise BadIncidentKey(f"{text[:80]!r} is not an incident key")

    def judged(self) -> IncidentKey | None:
        """The attempt a recovery check judged (`verify:1001.0` judged 1001.1, the successor of
        the requeued 1001.0); None for keys of anything else."""
        if self.kind != "verify" or self.job is None or self.attempt is None:
            return None
        return IncidentKey.of_attempt(self.job, self.attempt + 1)

    def next_failure(self) -> IncidentKey:
        """The key of the node's next failure (node incidents only)."""
        assert self.kind == "node" and self.node is not None
        return IncidentKey.of_node(self.node, self.seq + 1)


def drain_reason(incident: str, cause: str, note: str = "") -> str:
    """The reason a drain gives Slurm: `slurmedic: <incident> <cause>`, then `note` (words that
    say more: a repeat and its window) as far as the playbooks' reason pattern allows. The key
    and the cause always fit (76 + 1 + 21 of the pattern's 160); the note's last words give
    way, so that a drain is never refused for its reason's length (the decision's own reason,
    in the ledger, keeps every word)."""
    reason = f"{REASON}{incident} {cause}"
    words = note.split()
    while words and not DRAIN_REASON.match(" ".join([reason, *words])):
        words.pop()
    return " ".join([reason, *words])


def judged_attempt(text: str) -> str | None:
    """The attempt a recovery check's key judged (`verify:1001.0` -> `1001.1`); None for any
    other text, a key of something else or none at all (a scenario's history holds no keys)."""
    try:
        key = IncidentKey.parse(text).judged()
    except BadIncidentKey:
        return None
    return str(key) if key is not None else None


def attempt_of(text: str) -> int:
    """The restart count an incident key names (0 for keys of no job)."""
    key = IncidentKey.parse(text)
    return key.attempt if key.attempt is not None else 0
