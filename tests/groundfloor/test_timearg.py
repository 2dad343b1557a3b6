"""The one parser of command-line times (report, web, backfill, transfers-prometheus)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpugap.groundfloor.timearg import parse_time
from gpugap.schemas.errors import ConfigError

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("now", NOW),
        ("-30d", NOW - timedelta(days=30)),
        ("-1.5h", NOW - timedelta(hours=1.5)),
        ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),  # no offset: UTC
        ("2026-11-01T10:00+01:00", datetime(2026, 11, 1, 9, tzinfo=UTC)),
        ("1764590400", datetime(2025, 12, 1, 12, tzinfo=UTC)),  # epoch seconds
        ("1764590400.5", datetime(2025, 12, 1, 12, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_every_form_of_time(text: str, want: datetime) -> None:
    assert parse_time(text, NOW) == want


def test_a_bad_time_names_who_and_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^backfill: --since 'yesterday' is not a time"):
        parse_time("yesterday", NOW, "--since", "backfill")
    with pytest.raises(ConfigError, match=r"^--until '2026' is not a time"):  # a year, not epoch
        parse_time("2026", NOW, "--until")
