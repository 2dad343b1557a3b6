"""The Native format at a client's ``client_protocol_version``.

chDB writes Native as ClickHouse does for revision 0, and its engine cannot be told a client's
revision (in ClickHouse that is the HTTP handler's business, not a setting). A revision changes
only the framing (NativeWriter): from 1 each block starts with a BlockInfo, from 54454 each
column has a ``has_custom_serialization`` byte after its type name (0: the engine writes no
sparse columns here), below 54405 LowCardinality goes as its plain type (not done here: such
clients, from before 2018, get a clear error instead). So for a client with a revision the
engine answers in its ``Buffers`` format, which gives each block's row count and each
column's size beside the same serialized data as Native's, and the blocks are framed from
those sizes: no value is looked at, whatever the answer holds, and nothing is copied. The
columns' names and types come from the engine's description of the query.

Native *input* needs nothing: ClickHouse reads an INSERT's Native data at revision 0 whatever
the client's revision (NativeInputFormat), and clients send it so.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from gpugap.warehouse.embedded.errors import EngineError

MIN_REVISION_WITH_LOW_CARDINALITY, MIN_REVISION_WITH_CUSTOM_SERIALIZATION = 54405, 54454
# field 1: is_overflows = 0; field 2: bucket_num = -1; 0: the end (BlockInfo::write)
BLOCK_INFO = b"\x01\x00\x02\xff\xff\xff\xff\x00"
NO_CUSTOM_SERIALIZATION = b"\x00"
_U64, _TWO_U64 = struct.Struct("<Q"), struct.Struct("<QQ")

# types whose serialization is the same at every revision the endpoint frames for
_PLAIN = frozenset(
    {
        "UInt8", "Int8", "Bool", "UInt16", "Int16", "Date", "BFloat16", "UInt32", "Int32",
        "Float32", "Date32", "DateTime", "IPv4", "Time", "UInt64", "Int64", "Float64",
        "DateTime64", "Time64", "Decimal32", "Decimal64", "UInt128", "Int128", "UUID", "IPv6",
        "Decimal128", "UInt256", "Int256", "Decimal256", "Decimal", "String", "FixedString",
        "Nothing", "Enum8", "Enum16",
    }
)  # fmt: skip
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


def frame(buffers: bytes | bytearray, columns: Sequence[tuple[str, str]], revision: int) -> Framed:
    """The engine's ``Buffers`` answer as Native blocks for ``revision`` (> 0), with the
    columns' names and types given: a block header and each column's slice of the data."""
    for _, type_name in columns:
        check_type(type_name, revision)
    custom = NO_CUSTOM_SERIALIZATION if revision >= MIN_REVISION_WITH_CUSTOM_SERIALIZATION else b""
    heads = [_string(name) + _string(type_name) + custom for name, type_name in columns]
    view = memoryview(buffers)
    pieces: list[bytes | memoryview] = []
    pos = rows = 0
    try:
        while pos < len(buffers):
            count, n = _TWO_U64.unpack_from(buffers, pos)
            pos += _TWO_U64.size
            if count != len(columns):
                raise Truncated()
            pieces.append(BLOCK_INFO + varint(count) + varint(n))
            rows += n
            for head in heads:
                (size,) = _U64.unpack_from(buffers, pos)
                pos += _U64.size
                if pos + size > len(buffers):
                    raise Truncated()
                pieces.append(head)
                if size:
                    pieces.append(view[pos : pos + size])
                pos += size
    except struct.error:
        raise Truncated() from None
    if not pieces:  # no rows: still one block, with the columns (clients read them from it)
        pieces = [BLOCK_INFO + varint(len(columns)) + varint(0), *heads]
    return Framed(pieces, rows, sum(len(p) for p in pieces))


@functools.lru_cache(maxsize=512)
def check_type(type_name: str, revision: int) -> None:
    """Unsupported unless ``type_name`` goes out the same at ``revision`` as at 0 (but for
    the framing): the types whose serialization depends on the revision (Dynamic, JSON,
    Variant, Object, and LowCardinality below 54405) are refused, not sent wrong."""
    name, args = _split_type(type_name)
    if name in _ALIASES and not args:
        return check_type(_ALIASES[name], revision)
    if name in _PLAIN or name.startswith("Interval"):
        return None
    if name == "SimpleAggregateFunction" and len(args) >= 2:
        return check_type(args[-1], revision)
    if name in ("Nullable", "Array") and len(args) == 1:
        return check_type(args[0], revision)
    if name == "Map" and len(args) == 2:
        return check_type(f"Tuple({', '.join(args)})", revision)
    if name == "Tuple" and args:
        for arg in args:
            check_type(_element_type(arg), revision)
        return None
    if name == "LowCardinality" and len(args) == 1:
        if revision < MIN_REVISION_WITH_LOW_CARDINALITY:
            raise Unsupported(type_name, revision)  # ClickHouse would send the plain type
        return check_type(args[0], revision)
    raise Unsupported(type_name, revision)


def header_block(columns: Sequence[tuple[str, str]]) -> bytes:
    """The block ClickHouse writes at revision 0 for a Native result with no rows (its
    columns' names and types: clickhouse-go reads the columns from it), which chDB leaves
    out."""
    return (
        varint(len(columns))
        + varint(0)
        + b"".join(_string(name) + _string(type_name) for name, type_name in columns)
    )


def _string(text: str) -> bytes:
    data = text.encode()
    return varint(len(data)) + data


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def read_varint(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    """(value, position after it) of the LEB128 varint at ``pos``."""
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
