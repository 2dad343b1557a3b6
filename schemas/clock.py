"""Event time as integer milliseconds since the Unix epoch: the units and conversions the
records and the stream core share, so no module writes 60_000 or 3_600_000 by hand.

Integers, because minute boundaries and watermarks must compare exactly; a float timestamp
(``datetime.timestamp() * 1000``) can land a millisecond short of a boundary.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

MINUTE_S = 60
HOUR_S = 60 * MINUTE_S
DAY_S = 24 * HOUR_S

#: records carry millisecond precision; datetimes count microseconds
MILLISECOND_US = 1000

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms(t: datetime) -> int:
    """Milliseconds since the epoch, exactly (no float rounding)."""
    d = t - EPOCH
    return (d.days * DAY_S + d.seconds) * SECOND_MS + d.microseconds // MILLISECOND_US


def at(t_ms: int) -> datetime:
    """The UTC datetime of epoch milliseconds ``t_ms`` (the inverse of :func:`ms`)."""
    return EPOCH + timedelta(milliseconds=t_ms)


def minute_floor(t_ms: int) -> int:
    """The start of the UTC minute holding ``t_ms``."""
    return t_ms // MINUTE_MS * MINUTE_MS


def parse_utc(text: str) -> datetime:
    """A time in the wire format (``schemas.types.format_utc``) back to an aware datetime."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
