"""Verdicts as a form or the CLI gives them: the alternatives an operator means, checked at the
boundary with one line naming the field, and short enough for the ledger's column."""

from __future__ import annotations

import pytest

from webhook.core.policy import ACTIONS
from webhook.core.verdicts import ALTERNATIVES, MEANS, WOULD, VerdictError, verdict
from webhook.ledger.schema import VerdictRow


@pytest.mark.parametrize("would", ALTERNATIVES)
def test_a_disagreement_may_name_an_alternative(would: str) -> None:
    assert verdict(verdict="disagree", would=would, by="kim").would == would


def test_the_alternatives_are_their_own_and_each_says_what_it_means() -> None:
    assert not set(ALTERNATIVES) & set(ACTIONS) and set(MEANS) == set(ALTERNATIVES)
    assert (*ACTIONS, *ALTERNATIVES) == WOULD
    assert max(map(len, WOULD)) <= VerdictRow.__table__.c.would.type.length


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"verdict": "disagree", "would": "reflash"}, "would: Input should be 'drain'"),
        ({"verdict": "disagree"}, "would: a disagreement names the action"),
        ({"verdict": "agree", "would": "wait"}, "would: only a disagreement names another"),
        ({"verdict": "maybe"}, "verdict: Input should be 'agree'"),
    ],
)
def test_a_bad_verdict_is_one_line_naming_its_field(fields: dict[str, str], error: str) -> None:
    with pytest.raises(VerdictError) as e:
        verdict(by="kim", **fields)
    assert str(e.value).startswith(error) and "\n" not in str(e.value)
