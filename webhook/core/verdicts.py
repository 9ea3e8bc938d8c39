"""An operator's verdict on a recommendation: the trial's unit of judgement.

Recorded in any mode (a monitor-mode trial is judged as much as an approve-mode one), appended
and never edited: a second verdict on the same decision is a change of mind, kept beside the
first. `disagree` says what the operator would have done instead: one of the policy's actions,
or an alternative finer than the actions, as an operator means it (docs/console.md).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from webhook.core.policy import ACTIONS, Action
from webhook.core.validation import describe

Judgement = Literal["agree", "disagree", "unsure"]
JUDGEMENTS: tuple[Judgement, ...] = ("agree", "disagree", "unsure")
# What an operator would have done that no action of the policy says. At most 16 characters:
# the ledger's `would` column.
Alternative = Literal["requeue_anywhere", "let_finish", "wait", "drain_only"]
ALTERNATIVES: tuple[str, ...] = get_args(Alternative)
MEANS = {
    "requeue_anywhere": "requeue without excluding any node",
    "let_finish": "leave the job running to its end",
    "wait": "do nothing yet, look again later",
    "drain_only": "drain the nodes, leave the job alone",
}
Would = Literal[Action, Alternative]
WOULD: tuple[str, ...] = (*ACTIONS, *ALTERNATIVES)
# Who recorded it: a login name or a console user (never a free-form string in a report).
WHO = r"^[A-Za-z0-9._@-]{1,64}$"


class VerdictError(ValueError):
    """A verdict that does not validate; the message names the field."""


class OperatorVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    verdict: Judgement
    would: Would | None = None  # disagree: what the operator would have done instead
    note: str = Field(default="", max_length=2000)
    by: str = Field(pattern=WHO)

    @model_validator(mode="after")
    def _alternative(self) -> OperatorVerdict:
        if self.verdict == "disagree" and self.would is None:
            raise ValueError("would: a disagreement names the action the operator would take")
        if self.verdict != "disagree" and self.would is not None:
            raise ValueError(f"would: only a disagreement names another action ({self.verdict})")
        return self


def verdict(**fields: object) -> OperatorVerdict:
    """A verdict from a form or the CLI, or VerdictError naming the field."""
    try:
        return OperatorVerdict.model_validate(fields)
    except ValidationError as e:
        raise VerdictError(describe(e)) from e
