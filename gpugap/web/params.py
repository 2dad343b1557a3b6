"""What the browser may ask: every query-string parameter of the page's API, validated and
bounded before any query runs. Nothing here is SQL: the values become bound parameters of the
fixed queries in ``gpugap.web.queries``; an unknown, repeated or out-of-range parameter is a
400 with one line saying which."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

# the page's time range: whole seconds since the epoch, 1970..2100 (DateTime ends in 2106)
MIN_TIME = 0
MAX_TIME = 4_102_444_800  # 2100-01-01
MAX_RANGE_S = 400 * 86_400  # about 13 months
MAX_VALUES = 50  # per list filter (clusters, teams, classes)
MAX_VALUE_LEN = 128
MAX_ID_LEN = 256  # an allocation id
MAX_LIMIT = 200
DEFAULT_LIMIT = 25
BY = ("class", "scheduler", "team")
LISTS = ("cluster", "team", "class")
# printable, no control characters (names, ids: slurm/c1/123, k8s/ns/pod-0)
_TEXT = re.compile(r"^[^\x00-\x1f\x7f]+$")


class BadRequest(ValueError):
    """A parameter the API refuses: the message names it (the server answers 400)."""


@dataclass(frozen=True)
class Filters:
    since: datetime
    until: datetime
    clusters: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    by: str = "class"
    limit: int = DEFAULT_LIMIT

    def bound(self) -> dict[str, object]:
        """The values every query may bind ({since:DateTime('UTC')}, {clusters:Array(String)})."""
        return {
            "since": self.since,
            "until": self.until,
            "clusters": list(self.clusters),
            "teams": list(self.teams),
            "classes": list(self.classes),
            "limit": self.limit,
        }


@dataclass(frozen=True)
class AllocationKey:
    cluster: str
    allocation_id: str


@dataclass(frozen=True)
class JobKey:
    id: str  # as gpugap job takes it (gpugap.job.queries.id_form)
    cluster: str | None


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"{name}: give it once")
    return values[0]


def _text(name: str, value: str, limit: int) -> str:
    if not value or len(value) > limit or not _TEXT.match(value):
        raise BadRequest(f"{name}: 1 to {limit} printable characters")
    return value


def _epoch(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    if not re.fullmatch(r"\d{1,10}", value) or not MIN_TIME <= int(value) <= MAX_TIME:
        raise BadRequest(f"{name}: whole seconds since 1970, at most {MAX_TIME} (2100)")
    return datetime.fromtimestamp(int(value), UTC)


def _int(name: str, value: str | None, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if not re.fullmatch(r"\d{1,4}", value) or not low <= int(value) <= high:
        raise BadRequest(f"{name}: an integer from {low} to {high}")
    return int(value)


def _check_names(query: Mapping[str, list[str]], allowed: set[str]) -> None:
    unknown = sorted(set(query) - allowed)
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0][:40]!r}")


def filters(query: Mapping[str, list[str]], now: datetime) -> Filters:
    """from, to (epoch seconds; default: the 24 hours before ``now``), cluster/team/class
    (repeated, up to 50 each), by (class|scheduler|team), limit (1..200)."""
    _check_names(query, {"from", "to", "by", "limit", *LISTS})
    until = _epoch("to", _one(query, "to")) or now
    since = _epoch("from", _one(query, "from")) or datetime.fromtimestamp(
        max(MIN_TIME, int(until.timestamp()) - 86_400), UTC
    )
    if since >= until:
        raise BadRequest("from must be before to")
    if (until - since).total_seconds() > MAX_RANGE_S:
        raise BadRequest(f"the time range is at most {MAX_RANGE_S // 86_400} days")
    lists: dict[str, tuple[str, ...]] = {}
    for name in LISTS:
        values = query.get(name, [])
        if len(values) > MAX_VALUES:
            raise BadRequest(f"{name}: at most {MAX_VALUES} values")
        lists[name] = tuple(sorted({_text(name, v, MAX_VALUE_LEN) for v in values}))
    by = _one(query, "by") or "class"
    if by not in BY:
        raise BadRequest(f"by: one of {', '.join(BY)}")
    return Filters(
        since=since,
        until=until,
        clusters=lists["cluster"],
        teams=lists["team"],
        classes=lists["class"],
        by=by,
        limit=_int("limit", _one(query, "limit"), DEFAULT_LIMIT, 1, MAX_LIMIT),
    )


def allocation(query: Mapping[str, list[str]]) -> AllocationKey:
    """cluster and allocation (its id), both required."""
    _check_names(query, {"cluster", "allocation", "from", "to"})
    cluster = _one(query, "cluster")
    alloc = _one(query, "allocation")
    if cluster is None or alloc is None:
        raise BadRequest("cluster and allocation are required")
    return AllocationKey(
        _text("cluster", cluster, MAX_VALUE_LEN), _text("allocation", alloc, MAX_ID_LEN)
    )


def job(query: Mapping[str, list[str]]) -> JobKey:
    """id (required: a Slurm job id, array task or run, namespace/pod, a pod UID or an
    allocation id, as ``gpugap job`` takes it) and cluster (optional)."""
    from gpugap.job.queries import id_form

    _check_names(query, {"id", "cluster"})
    ident = _one(query, "id")
    if ident is None:
        raise BadRequest("id is required")
    try:
        id_form(ident)
    except ValueError as exc:
        raise BadRequest(f"id: {exc}") from None
    cluster = _one(query, "cluster")
    return JobKey(ident, None if cluster is None else _text("cluster", cluster, MAX_VALUE_LEN))
