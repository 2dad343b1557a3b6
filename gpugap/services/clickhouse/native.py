"""The Native format at a client's ``client_protocol_version``.

chDB writes Native as ClickHouse does for revision 0, and its engine cannot be told a client's
revision (in ClickHouse that is the HTTP handler's business, not a setting). A revision changes
only the framing (NativeWriter): from 1 each block starts with a BlockInfo, from 54454 each
column has a ``has_custom_serialization`` byte after its type name (0: chDB's rev-0 output has
no sparse columns), below 54405 LowCardinality goes as its plain type (not done here: such
clients, from before 2018, get a clear error instead). So the engine's bytes are walked far
enough to find each column's end and the markers go between slices of them: nothing is copied.

Native *input* needs nothing: ClickHouse reads an INSERT's Native data at revision 0 whatever
the client's revision (NativeInputFormat), and clients send it so.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass

from gpugap.services.clickhouse.engine import EngineError

MIN_REVISION_WITH_LOW_CARDINALITY, MIN_REVISION_WITH_CUSTOM_SERIALIZATION = 54405, 54454
# field 1: is_overflows = 0; field 2: bucket_num = -1; 0: the end (BlockInfo::write)
BLOCK_INFO = b"\x01\x00\x02\xff\xff\xff\xff\x00"
NO_CUSTOM_SERIALIZATION = b"\x00"

_FIXED = {
    **dict.fromkeys(("UInt8", "Int8", "Bool", "Enum8"), 1),
    **dict.fromkeys(("UInt16", "Int16", "Date", "Enum16", "BFloat16"), 2),
    **dict.fromkeys(("UInt32", "Int32", "Float32", "Date32", "DateTime", "IPv4", "Time"), 4),
    **dict.fromkeys(("UInt64", "Int64", "Float64", "DateTime64", "Time64", "Decimal64"), 8),
    **dict.fromkeys(("UInt128", "Int128", "UUID", "IPv6", "Decimal128"), 16),
    **dict.fromkeys(("UInt256", "Int256", "Decimal256"), 32),
    "Decimal32": 4,
}
# the geo types are aliases of tuples and arrays of them
_ALIASES = {
    "Point": "Tuple(Float64, Float64)",
    "Ring": "Array(Point)",
    "LineString": "Array(Point)",
    "Polygon": "Array(Ring)",
    "MultiLineString": "Array(Ring)",
    "MultiPolygon": "Array(Polygon)",
}


def parse_revision(value: str | None) -> int:
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise EngineError(
            f"Cannot parse string '{value}' as UInt64: syntax error at begin of string",
            6,
            "CANNOT_PARSE_TEXT",
        ) from None


class Unsupported(EngineError):
    def __init__(self, type_name: str, revision: int) -> None:
        super().__init__(
            f"The embedded endpoint cannot send type {type_name} in Native format at "
            f"client_protocol_version {revision}: ask for another format, or omit "
            "client_protocol_version",
            48,
            "NOT_IMPLEMENTED",
        )


class Truncated(EngineError):
    def __init__(self) -> None:
        super().__init__("Cannot read all data in Native format", 33, "CANNOT_READ_ALL_DATA")


@dataclass
class Framed:
    pieces: list[bytes | memoryview]  # the response body, in order
    rows: int
    size: int


def reframe(data: bytes, revision: int) -> Framed:
    """``data`` (Native, revision 0) framed for ``revision``. Only the boundaries are walked."""
    view = memoryview(data)
    pieces: list[bytes | memoryview] = []
    pos = done = rows = 0
    custom = revision >= MIN_REVISION_WITH_CUSTOM_SERIALIZATION
    try:
        while pos < len(data):
            pieces.append(BLOCK_INFO)
            columns, pos = _varint(data, pos)
            n, pos = _varint(data, pos)
            rows += n
            for _ in range(columns):
                length, pos = _varint(data, pos)  # the name
                length, pos = _varint(data, pos + length)  # the type
                type_name = bytes(view[pos : pos + length]).decode()
                pos += length
                if custom:
                    pieces.append(view[done:pos])
                    pieces.append(NO_CUSTOM_SERIALIZATION)
                    done = pos
                if n:  # no rows: no data at all, not even a state prefix
                    skip = _skipper(type_name, revision)
                    pos = skip.data(data, skip.prefix(data, pos), n)
            pieces.append(view[done:pos])
            done = pos
    except IndexError:
        raise Truncated() from None
    if pos != len(data):
        raise Truncated()
    pieces = [p for p in pieces if len(p)]
    return Framed(pieces, rows, sum(len(p) for p in pieces))


# --- walking one column -----------------------------------------------------------------------

Walk = Callable[[bytes, int, int], int]  # (data, position, rows) -> position after them


@dataclass(frozen=True)
class _Skip:
    prefix: Callable[[bytes, int], int]  # the serialization state prefix (LowCardinality's)
    data: Walk


def _none(data: bytes, pos: int) -> int:
    return pos


@functools.lru_cache(maxsize=512)
def _skipper(type_name: str, revision: int) -> _Skip:
    name, args = _split_type(type_name)
    if name in _ALIASES and not args:
        return _skipper(_ALIASES[name], revision)
    size = _fixed_size(name, args)
    if size is not None:
        return _Skip(_none, lambda d, p, n: _need(d, p + size * n))
    if name == "String" and not args:
        return _Skip(_none, _strings)
    if name == "Nothing":
        return _Skip(_none, lambda d, p, n: _need(d, p + n))
    if name == "FixedString" and len(args) == 1:
        width = int(args[0])
        return _Skip(_none, lambda d, p, n: _need(d, p + width * n))
    if name == "SimpleAggregateFunction" and len(args) >= 2:
        return _skipper(args[-1], revision)
    if name == "Nullable" and len(args) == 1:
        inner = _skipper(args[0], revision)
        return _Skip(inner.prefix, lambda d, p, n: inner.data(d, _need(d, p + n), n))
    if name in ("Array", "Map") and args:
        inner = _skipper(args[0] if name == "Array" else f"Tuple({', '.join(args)})", revision)
        return _Skip(inner.prefix, lambda d, p, n: _array(inner, d, p, n))
    if name == "Tuple" and args:
        parts = [_skipper(_element_type(a), revision) for a in args]
        return _Skip(_each_prefix(parts), lambda d, p, n: _each_data(parts, d, p, n))
    if name == "LowCardinality" and len(args) == 1:
        if revision < MIN_REVISION_WITH_LOW_CARDINALITY:
            raise Unsupported(type_name, revision)  # ClickHouse would send the plain type
        inner_name, inner_args = _split_type(args[0])
        keys = _skipper(inner_args[0] if inner_name == "Nullable" else args[0], revision)
        return _Skip(lambda d, p: _need(d, p + 8), lambda d, p, n: _low_cardinality(keys, d, p))
    raise Unsupported(type_name, revision)


def _fixed_size(name: str, args: list[str]) -> int | None:
    if name == "Decimal" and args:
        precision = int(args[0])
        return 4 if precision <= 9 else 8 if precision <= 18 else 16 if precision <= 38 else 32
    if name.startswith("Interval"):
        return 8
    if name in ("DateTime", "DateTime64", "Time64") or name.startswith(("Enum", "Decimal")):
        return _FIXED.get(name)
    return _FIXED.get(name) if not args else None


def _need(data: bytes, pos: int) -> int:
    if pos > len(data):
        raise Truncated()
    return pos


def _strings(data: bytes, pos: int, n: int) -> int:
    # the hot loop of this module: one varint length a value, mostly a single byte
    for _ in range(n):
        b = data[pos]
        if b < 0x80:
            pos += 1 + b
        else:
            length, pos = _varint(data, pos)
            pos += length
    return _need(data, pos)


def _array(inner: _Skip, data: bytes, pos: int, n: int) -> int:
    end = _need(data, pos + 8 * n)
    total = struct.unpack_from("<Q", data, end - 8)[0]
    return inner.data(data, end, total) if total else end


def _each_prefix(parts: list[_Skip]) -> Callable[[bytes, int], int]:
    def prefix(data: bytes, pos: int) -> int:
        for part in parts:
            pos = part.prefix(data, pos)
        return pos

    return prefix


def _each_data(parts: list[_Skip], data: bytes, pos: int, n: int) -> int:
    for part in parts:
        pos = part.data(data, pos, n)
    return pos


_INDEX_WIDTH = (1, 2, 4, 8)
_NEED_GLOBAL_DICTIONARY = 1 << 8
_HAS_ADDITIONAL_KEYS = 1 << 9


def _low_cardinality(keys: _Skip, data: bytes, pos: int) -> int:
    # (the rows are those of the indexes; an empty one, inside empty arrays, writes nothing:
    # _array does not call it then)
    flags = struct.unpack_from("<Q", data, pos)[0]
    pos += 8
    if flags & _NEED_GLOBAL_DICTIONARY or flags & 0xFF >= len(_INDEX_WIDTH):
        raise Truncated()
    if flags & _HAS_ADDITIONAL_KEYS:
        count = struct.unpack_from("<Q", data, pos)[0]
        pos = keys.data(data, pos + 8, count) if count else pos + 8
    count = struct.unpack_from("<Q", data, pos)[0]
    return _need(data, pos + 8 + count * _INDEX_WIDTH[flags & 0xFF])


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise Truncated()


read_varint = _varint  # for the header block execute.py builds for an empty result


# --- type names --------------------------------------------------------------------------------


def _split_type(type_name: str) -> tuple[str, list[str]]:
    """'Map(String, Array(UInt8))' -> ('Map', ['String', 'Array(UInt8)'])."""
    type_name = type_name.strip()
    open_at = type_name.find("(")
    if open_at < 0 or not type_name.endswith(")"):
        return type_name, []
    return type_name[:open_at].strip(), _split_args(type_name[open_at + 1 : -1])


def _split_args(text: str) -> list[str]:
    args, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'`\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    args.append(text[start:].strip())
    return [a for a in args if a]


def _element_type(arg: str) -> str:
    """A tuple element: 'Type', or 'name Type' (the name possibly `quoted`)."""
    if arg.startswith("`"):
        i = 1
        while i < len(arg) and arg[i] != "`":
            i += 2 if arg[i] == "\\" else 1
        return arg[i + 1 :].strip()
    head, _, rest = arg.partition(" ")
    return rest.strip() if rest and "(" not in head else arg
