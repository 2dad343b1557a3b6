"""A ``multipart/form-data`` request, read the way ClickHouse's HTTP interface reads one
(HTTPHandler.cpp: ``DynamicQueryHandler::getQuery``; HTMLForm.cpp: ``readMultipart``).
clickhouse-connect sends its query and bind parameters so once they would make the URL longer
than 4 KiB (or always, with ``form_encode_query_params``).

- The query is every ``query`` value, the URL's first, then the form's, joined as they come;
  the body is not read as SQL.
- ``param_*`` values bind the query's ``{name:Type}`` parameters; the first of a name wins, so a
  URL parameter wins over a form field (``customizeQueryParam`` keeps a parameter already set).
- Every other field is not read at all: ClickHouse takes settings, ``readonly``, ``database``,
  ``default_format``, credentials and sessions from the URL and the headers alone, before it
  reads the form. A form field therefore changes no setting here either, and no check is
  skipped: the URL's still go through the policy (server.py).
- A file part is an external table in ClickHouse, which the embedded endpoint does not have:
  refused, naming the part.

An ``application/x-www-form-urlencoded`` body is no form to ClickHouse: its HTMLForm holds the
URL's parameters only, and the body is (the rest of) the query's text, as ClickHouse's own
examples send it (``curl -d 'SELECT ...'`` labels a body so). Here likewise.

The body is read whole, bounded: GPUGAP_CLICKHOUSE_SERVE_MAX_FORM_BYTES in all, MAX_FORM_FIELDS
parts, and each field's name and value what one URL parameter may be (MAX_URI_BYTES). Its
Content-Encoding is undone as for any body (ClickHouse parses a form's raw bytes, so a
compressed form is one more thing accepted here, bounded the same)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesHeaderParser
from email.utils import collapse_rfc2231_value

from aiohttp import web

from gpugap.warehouse.embedded import body
from gpugap.warehouse.embedded.errors import EngineError
from gpugap.warehouse.embedded.limits import EndpointLimits

MULTIPART = "multipart/form-data"
# URL parameters that describe an external table in a multipart request, not settings
# (HTTPHandler skips them there: "_format" would otherwise read as a format setting)
EXTERNAL_TABLE_SUFFIXES = ("_format", "_types", "_structure")
_PREFIX = "param_"


@dataclass(frozen=True)
class Form:
    query: str
    params: dict[str, str] = field(default_factory=dict)  # bind parameters, without the prefix


def is_multipart(request: web.BaseRequest) -> bool:
    return request.content_type == MULTIPART


def bind_params(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``param_<name>`` values by name, the first of each name kept (as ClickHouse does)."""
    params: dict[str, str] = {}
    for name, value in pairs:
        if name.startswith(_PREFIX):
            params.setdefault(name[len(_PREFIX) :], value)
    return params


async def read(request: web.BaseRequest, limits: EndpointLimits) -> Form:
    """The query and its parameters from the URL and the multipart body together."""
    url: list[tuple[str, str]] = list(request.query.items())
    fields: list[tuple[str, str]] = []
    # (ClickHouse reads a form body only for the methods that carry one)
    if request.method not in ("GET", "HEAD"):
        kind = Message()
        kind["Content-Type"] = request.headers.get("Content-Type", "")
        boundary = _param(kind, "boundary", "content-type")
        if not boundary:
            raise malformed("the multipart/form-data Content-Type has no boundary")
        fields = parse(await _whole(request, limits), boundary, limits)
    pairs = url + fields
    query = "".join(value for name, value in pairs if name == "query")
    return Form(query, bind_params(pairs))


async def once(data: bytes) -> AsyncIterator[bytes]:
    """``data`` as a request body stream (the query a form held, where the engine reads one)."""
    if data:
        yield data


def parse(data: bytes, boundary: str, limits: EndpointLimits) -> list[tuple[str, str]]:
    """The form's fields (name, value), in order. RFC 7578 as HTMLForm reads it: text before
    the first boundary line and after the last is ignored, a part without a name is a field
    without one (which nothing reads)."""
    delimiter = b"--" + boundary.encode("utf-8", "surrogateescape")
    if data.startswith(delimiter):
        pos = 0
    elif (first := data.find(b"\r\n" + delimiter)) >= 0:
        pos = first + 2
    else:
        raise malformed("No boundary line found")
    fields: list[tuple[str, str]] = []
    while True:
        after = pos + len(delimiter)
        if data.startswith(b"--", after):  # the last boundary line
            return fields
        line_end = data.find(b"\r\n", after)
        if line_end < 0:
            raise truncated()
        if len(fields) == limits.max_form_fields:
            raise too_much(
                f"Too many form fields: more than {limits.max_form_fields}", "MAX_FORM_FIELDS"
            )
        start = line_end + 2
        end = data.find(b"\r\n" + delimiter, start)
        if end < 0:
            raise truncated()
        fields.append(_field(data[start:end], limits.max_uri_bytes))
        pos = end + 2


def _field(part: bytes, max_bytes: int) -> tuple[str, str]:
    if part.startswith(b"\r\n"):  # a part without headers
        head, content = b"", part[2:]
    else:
        head, blank, content = part.partition(b"\r\n\r\n")
        if not blank:
            raise malformed("a part of the multipart/form-data body has no end of its headers")
    # (the standard library's reading of MIME headers: quoted and RFC 2231 parameters, and
    # what it cannot read is a defect it keeps, never a warning in the endpoint's log)
    headers = BytesHeaderParser().parsebytes(head)
    name = _param(headers, "name", "content-disposition") or ""
    if _param(headers, "filename", "content-disposition") is not None:
        raise EngineError(
            f"External data is not supported by the embedded endpoint: the multipart/form-data "
            f"body has a file part {name[:100]!r} (an external table in ClickHouse); put the "
            "data in the query or INSERT it into a table first",
            48,
            "NOT_IMPLEMENTED",
        )
    if len(name.encode()) > max_bytes:
        raise too_much(f"Field name too long: more than {max_bytes} bytes", "MAX_URI_BYTES")
    if len(content) > max_bytes:
        raise too_much(
            f"Field value too long: {name[:100]!r} has more than {max_bytes} bytes",
            "MAX_URI_BYTES",
        )
    return name, content.decode("utf-8", "replace")


def _param(headers: Message, name: str, header: str) -> str | None:
    value = headers.get_param(name, None, header=header)
    return None if value is None else collapse_rfc2231_value(value)


async def _whole(request: web.BaseRequest, limits: EndpointLimits) -> bytes:
    data = bytearray()
    try:
        async for chunk in body.chunks(
            request,
            limit=limits.max_form_bytes,
            what="the multipart/form-data body",
            timeout_s=limits.receive_timeout_s,
        ):
            data += chunk
    except body.TooLarge:
        raise too_much(
            f"The multipart/form-data body is larger than {limits.max_form_bytes} bytes",
            "MAX_FORM_BYTES",
        ) from None
    return bytes(data)


def too_much(text: str, setting: str) -> EngineError:
    exc = EngineError(
        f"{text} (the endpoint's limit, GPUGAP_CLICKHOUSE_SERVE_{setting})",
        290,
        "LIMIT_EXCEEDED",
    )
    exc.status = 413
    return exc


def malformed(text: str) -> EngineError:
    exc = EngineError(f"HTML Form Exception: {text}", 1000, "POCO_EXCEPTION")
    exc.status = 400  # (ClickHouse answers 500 to its Poco exceptions: it is the client's error)
    return exc


def truncated() -> EngineError:
    return EngineError(
        "Unexpected EOF, did not find the last boundary while parsing a multipart HTTP request",
        33,
        "CANNOT_READ_ALL_DATA",
    )
