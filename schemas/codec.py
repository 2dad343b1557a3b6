"""The one codec: record <-> JSON bytes. Decoding failures raise InvalidRecord with a reason
naming the field, so callers can dead-letter them."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError

from gpugap.schemas.errors import MalformedRecord, SchemaViolation
from gpugap.schemas.models import Record
from gpugap.schemas.topics import Topic
from gpugap.schemas.types import GPU_UUID_PATTERN

M = TypeVar("M", bound=Record)


def encode(record: Record) -> bytes:
    return record.__pydantic_serializer__.to_json(record, exclude_none=True)


def decode(topic: Topic[M], data: bytes | bytearray | str | None) -> M:
    """Bytes from ``topic`` -> its model, or InvalidRecord saying what is wrong and where."""
    if data is None:
        raise MalformedRecord(f"{topic.name}: empty message (null value)")
    try:
        return topic.model.model_validate_json(data)
    except ValidationError as exc:
        raise _invalid(topic, exc) from None


def _invalid(topic: Topic[Any], exc: ValidationError) -> MalformedRecord | SchemaViolation:
    errors = exc.errors(include_url=False)
    if any(e["type"] == "json_invalid" for e in errors):
        msg = next(e["msg"] for e in errors if e["type"] == "json_invalid")
        return MalformedRecord(
            f"{topic.name}: not valid JSON: {msg.removeprefix('Invalid JSON: ')}"
        )
    parts = []
    for e in errors[:5]:
        field = ".".join(str(p) for p in e["loc"]) or "(record)"
        msg = e["msg"]
        if (
            e["type"] == "string_pattern_mismatch"
            and e.get("ctx", {}).get("pattern") == GPU_UUID_PATTERN
        ):
            msg = "should be a GPU UUID ('GPU-<uuid>', 'MIG-<uuid>' or 'MIG-GPU-<uuid>/<gi>/<ci>')"
        got = e.get("input")
        if (
            isinstance(got, (int, float, str))
            and not isinstance(got, bool)
            and len(repr(got)) <= 80
        ):
            msg += f" (got {got!r})"
        parts.append(f"{field}: {msg}")
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return SchemaViolation(f"{topic.name}: " + "; ".join(parts) + more)
