"""Times on the command line: ISO-8601 (``2026-11-01``, ``2026-11-01T10:00Z``, with an
offset) or relative to now (``-24h``, ``-7d``, ``-90m``, ``-2w``, ``now``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from schemas.errors import ConfigError

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
HELP = "ISO-8601 (2026-11-01, 2026-11-01T10:00Z; no offset means UTC) or relative (-24h, -7d)"


def parse_time(text: str, now: datetime, flag: str = "time") -> datetime:
    """``text`` as an aware UTC datetime, or a ConfigError naming ``flag``."""
    value = text.strip()
    if value.lower() == "now":
        return now
    m = _RELATIVE.match(value.lower())
    if m:
        return now - timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(f"{flag}: cannot read {text!r} as a time: use {HELP}") from None
    # a time without an offset is UTC: every time gpugap stores or prints is
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def parse_window(
    since: str | None, until: str | None, now: datetime
) -> tuple[datetime | None, datetime | None]:
    """Both ends (None: unbounded); an empty or reversed range is a ConfigError."""
    start = parse_time(since, now, "--since") if since else None
    end = parse_time(until, now, "--until") if until else None
    if start is not None and end is not None and start >= end:
        what = "empty" if start == end else "reversed"
        raise ConfigError(
            f"{what} time range: --since {start:%Y-%m-%d %H:%M:%S} UTC is not before "
            f"--until {end:%Y-%m-%d %H:%M:%S} UTC"
        )
    return start, end
