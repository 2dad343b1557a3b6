"""The watch wire format: a chunked response of one JSON event per line, read line by line,
each line read as ``(type, object)`` or found not to be an event at all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def lines(resp: Any) -> Iterator[list[bytes]]:
    """Complete lines per read (a watch sends one JSON object per line)."""
    tail = b""
    for chunk in resp.stream(65536, decode_content=True):
        parts = (tail + chunk).split(b"\n")
        tail = parts.pop()
        complete = [p for p in parts if p.strip()]
        if complete:
            yield complete
    if tail.strip():
        yield [tail]


def parse_event(line: bytes) -> tuple[str, dict[str, Any]] | None:
    """(type, object) of one watch line; None when it is not a watch event at all."""
    try:
        event = json.loads(line)
    except ValueError:  # JSONDecodeError, and bytes that are not UTF-8
        return None
    if not isinstance(event, dict) or not isinstance(obj := event.get("object"), dict):
        return None
    return str(event.get("type")), obj


def resource_version(obj: dict[str, Any]) -> str | None:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None
