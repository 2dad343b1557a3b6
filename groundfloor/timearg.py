"""Times on the command line, for every command that takes one (the report, the web page,
backfill, transfers-prometheus): ISO-8601 (``2026-11-01``, ``2026-11-01T10:00Z``, with an
offset), epoch seconds, or relative to now (``-24h``, ``-7d``, ``-90m``, ``-2w``, ``now``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from gpugap.schemas.errors import ConfigError

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)$")
_EPOCH = re.compile(r"^\d{9,11}(\.\d+)?$")  # epoch seconds (1973 to 5138), not a year
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
HELP = (
    "ISO-8601 (2026-11-01, 2026-11-01T10:00Z; no offset means UTC), epoch seconds or relative "
    "(-24h, -7d)"
)


def parse_time(text: str, now: datetime, flag: str = "time", who: str = "") -> datetime:
    """``text`` as an aware UTC datetime, or a ConfigError naming ``who`` and ``flag``."""
    value = text.strip()
    if value.lower() == "now":
        return now
    m = _RELATIVE.match(value.lower())
    if m:
        return now - timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
    if _EPOCH.match(value):
        return datetime.fromtimestamp(float(value), UTC)
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        said = f"{who}: " if who else ""
        raise ConfigError(f"{said}{flag} {text!r} is not a time: use {HELP}") from None
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
