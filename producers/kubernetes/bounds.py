"""What one pod may make the producer publish and hold, and what becomes of a pod that breaks it.

Pod objects are written by users (labels, annotations, owner names), so their values are data
of any length. The schema bounds every string of a ``K8sPodEvent``; descriptive values over
their bound (owner, team, owner kind/name, gang id, resource names) are truncated here with a
marker rather than losing the pod's GPU accounting. What cannot be truncated (the pod's
identity, its node, a GPU count no node has, an object that does not read as a pod) makes one
dead letter with the reason, and the producer goes on with the other pods (DESIGN.md: one bad
record is a dead letter, never a stop).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import types
import typing
from collections.abc import Collection, Mapping
from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, ValidationError

from gpugap.schemas import DeadLetter, K8sPodEvent, utc_now
from gpugap.schemas.errors import InvalidRecord
from gpugap.schemas.topics import K8S_PODS
from gpugap.schemas.types import MAX_GANG_SIZE, MAX_LABELS, DeadLetterKind

CONSUMER = "kubernetes-producer"
#: what follows a truncated value: a digest of the whole one, so two long values that share
#: their first few thousand characters (two gangs, two owners) stay two values downstream
MARKER = "...[truncated sha256:"
#: the schema's bounds on a label (schemas.types.LabelKey, LabelValue)
MAX_LABEL_KEY, MAX_LABEL_VALUE = 317, 256
#: a pod is kept for the record up to this much of its JSON (``DeadLetter.value_b64``)
DEAD_VALUE_BYTES = 262_144


class Rejected(InvalidRecord, ValueError):
    """A pod that reads fine but that the producer refuses to report (the reason says why).
    A ValueError too, so code that reads owner specs leniently treats it like bad input."""

    kind = DeadLetterKind.REJECTED.value


def text_limit(model: type[BaseModel], field: str) -> int | None:
    """The ``max_length`` the schema gives a string field, through ``X | None`` and
    ``Annotated``: read from the model, so a bound changed in schemas/ is followed here."""
    info = model.model_fields[field]
    found = [n for m in info.metadata if (n := getattr(m, "max_length", None)) is not None]
    found += _lengths(info.annotation)
    return min(found) if found else None


def _lengths(annotation: Any) -> list[int]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        own = [n for m in meta if (n := getattr(m, "max_length", None)) is not None]
        return own + _lengths(base)
    if origin in (typing.Union, types.UnionType):
        return [n for arg in typing.get_args(annotation) for n in _lengths(arg)]
    return []


#: the K8sPodEvent fields that describe a pod (rather than identify it): truncated if too long
TRUNCATED_FIELDS = ("owner_kind", "owner_name", "owner", "team", "gang_id", "gpu_resource")
LIMITS: dict[str, int] = {
    f: n for f in TRUNCATED_FIELDS if (n := text_limit(K8sPodEvent, f)) is not None
}
#: a value this short fits every one of them (the common case, checked first)
SHORTEST = min(LIMITS.values(), default=sys.maxsize)


def truncate(value: str, limit: int) -> str:
    """``value`` if it fits in ``limit`` characters, else its head and the marker, exactly
    ``limit`` characters long."""
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    tail = f"{MARKER}{digest}]"
    if limit <= len(tail):
        return value[:limit]
    return value[: limit - len(tail)] + tail


def fit(field: str, value: str | None) -> str | None:
    """A descriptive value cut to its field's bound (``None`` and short values unchanged)."""
    limit = LIMITS.get(field)
    return value if value is None or limit is None else truncate(value, limit)


def gang_size(value: int | None) -> int | None:
    """A gang size from a label, if it is one the schema admits: more pods than that is no
    gang (and no reason to lose the pod), so the size is dropped and the gang id kept."""
    return value if value is None or 0 <= value <= MAX_GANG_SIZE else None


def str_map(value: object, keys: Collection[str] | None = None) -> dict[str, str]:
    """A label or annotation map as the rules can read it: string keys and values only (a
    malformed object must not crash the rules), and only ``keys`` when given (an owner kept
    in the cache holds the few keys the rules read, not its last-applied-configuration)."""
    if not isinstance(value, Mapping):
        return {}
    if keys is not None:
        picked = ((k, value.get(k)) for k in keys)
        return {k: v for k, v in picked if isinstance(v, str)}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def carried(labels: Mapping[str, str], patterns: Collection[str]) -> tuple[tuple[str, str], ...]:
    """The labels whose key matches one of ``patterns`` (shell-style), as sorted pairs: at most
    MAX_LABELS, and none past the schema's bounds (the API server checks label syntax, so
    only a non-Kubernetes source gets there; such a label is left out, the pod is kept)."""
    if not patterns:
        return ()
    keep = sorted(
        (k, v)
        for k, v in labels.items()
        if len(k) <= MAX_LABEL_KEY and len(v) <= MAX_LABEL_VALUE
        and any(fnmatchcase(k, p) for p in patterns)
    )  # fmt: skip
    return tuple(keep[:MAX_LABELS])


def why(exc: BaseException) -> tuple[DeadLetterKind, str]:
    """The dead-letter kind and a one-line reason for what went wrong with one pod."""
    if isinstance(exc, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'record'}: {err['msg']}"
            for err in exc.errors(include_url=False, include_input=False)
        )
        return DeadLetterKind.SCHEMA, f"not a valid {exc.title}: {problems}"
    if isinstance(exc, InvalidRecord):
        known = exc.kind in DeadLetterKind.__members__.values()
        return DeadLetterKind(exc.kind) if known else DeadLetterKind.REJECTED, exc.reason
    # anything else: a field the producer could not read as the Pod API says it is
    return DeadLetterKind.MALFORMED, f"unreadable pod object ({type(exc).__name__}: {exc})"


def clip(text: object, n: int = 120) -> str:
    s = str(text)
    return s if len(s) <= n else s[:n] + "..."


def dead_letter(
    cluster: str,
    what: str,
    kind: DeadLetterKind,
    reason: str,
    *,
    pod: object = None,
    raw: bytes | None = None,
    uid: object = None,
) -> DeadLetter:
    """A dead letter for ``k8s.pods.v1``: the pod object (or the raw bytes read) and why it
    could not be published, keyed like the record it would have been (``cluster/uid``)."""
    if raw is None:
        raw = json.dumps(_without_managed_fields(pod), default=str).encode()
    key = f"{cluster}/{uid}".encode() if isinstance(uid, str) and uid else None
    return DeadLetter(
        time=utc_now(),
        source_topic=K8S_PODS.name,
        key_b64=base64.b64encode(key).decode() if key is not None else None,
        value_b64=base64.b64encode(raw[:DEAD_VALUE_BYTES]).decode(),
        kind=kind,
        reason=f"{what}: {reason}"[:4000],
        consumer=CONSUMER,
    )


def _without_managed_fields(pod: object) -> object:
    """managedFields say which client wrote which field: bulk that explains nothing here."""
    if not isinstance(pod, Mapping) or not isinstance(pod.get("metadata"), Mapping):
        return pod
    meta = {k: v for k, v in pod["metadata"].items() if k != "managedFields"}
    return {**pod, "metadata": meta}
