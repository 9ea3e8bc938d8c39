"""The decision states are spelled once: the lifecycle's names, its State type and its table
agree, and the modules that write or read states use the names, never the strings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from webhook.core import lifecycle
from webhook.core.lifecycle import NOTE, STATES, State

REPO = Path(__file__).parents[2]
NAMED = {v for k, v in vars(lifecycle).items() if k.isupper() and isinstance(v, str) and v != NOTE}
USERS = [
    "webhook/app/metrics.py",
    "webhook/cli/review.py",
    "webhook/cli/decisions.py",
    "webhook/cli/switches.py",
    "webhook/service/loop.py",
    "webhook/ledger/store.py",
    "webhook/executor/dispatch.py",
]


def test_the_names_the_type_and_the_table_agree() -> None:
    assert set(get_args(State)) == STATES == NAMED


def test_no_module_that_moves_decisions_spells_a_state() -> None:
    states = "|".join(sorted(STATES))
    spelled = re.compile(rf"""["']({states})["']""")
    found = {
        f"{path}:{n}": line.strip()
        for path in USERS
        for n, line in enumerate((REPO / path).read_text().splitlines(), 1)
        if spelled.search(line)
    }
    # metrics.py's "failed" outcome of a recovery is core.recovery's, not a decision state.
    assert {k: v for k, v in found.items() if '("recovered", "failed"' not in v} == {}
