"""Alertmanager's webhook payload (version 4), validated at the boundary."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

FNV_OFFSET, FNV_PRIME, SEPARATOR = 14695981039346656037, 1099511628211, 0xFF
ZERO_TIME = "0001-01-01T00:00:00Z"


def fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager's fingerprint of a label set (prometheus/common's FNV-1a over sorted pairs)."""
    h = FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode():
                h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ SEPARATOR) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


class Alert(BaseModel):
    # Unknown fields are accepted: newer Alertmanager releases add some.
    model_config = ConfigDict(extra="allow")

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: AwareDatetime
    endsAt: AwareDatetime | None = None
    generatorURL: str = ""
    fingerprint: str = Field(default="", pattern=r"^[0-9a-f]{0,32}$")

    @field_validator("startsAt", "endsAt")
    @classmethod
    def _in_range(cls, v: datetime | None) -> datetime | None:
        # 0001-01-01T00:00:00+05:00 is a valid timestamp whose UTC is before year 1: the
        # ledger (and every comparison) works in UTC, so it is refused here, by name.
        if v is not None:
            try:
                v.astimezone(UTC)
            except OverflowError:
                raise ValueError(
                    "out of range: in UTC it falls before year 1 or after 9999"
                ) from None
        return v

    def model_post_init(self, _context: object) -> None:
        if not self.fingerprint:
            self.fingerprint = fingerprint(self.labels)


class Payload(BaseModel):
    model_config = ConfigDict(extra="allow")

    version: Literal["4"] = "4"  # Alertmanager's webhook payload version this reads
    receiver: str = ""
    status: Literal["firing", "resolved"]
    alerts: list[Alert] = Field(min_length=1)
    groupLabels: dict[str, str] = {}
    commonLabels: dict[str, str] = {}
    commonAnnotations: dict[str, str] = {}
    externalURL: str = ""
    groupKey: str = ""
    truncatedAlerts: int = 0


def wrap(alerts: list[Alert], receiver: str = "slurmedic") -> Payload:
    """The payload Alertmanager would send for `alerts` (replay's shorthand)."""
    status: Literal["firing", "resolved"] = (
        "firing" if any(a.status == "firing" for a in alerts) else "resolved"
    )
    return Payload(receiver=receiver, status=status, alerts=alerts)
