"""The endpoint's one error type, ClickHouse's own: a code, a name and ClickHouse's message
(what the engine said, tidied to read as a server's)."""

from __future__ import annotations

import re

_CODE = re.compile(r"Code: (\d+)\.")
_NAME = re.compile(r"\(([A-Z_]+)\)\s*$")
# the engine quotes our own wrapper query in its errors: not the client's business
_SCOPE = re.compile(r"(?::|\.)?\s*In scope SELECT formatQuerySingleLine\(.*\)\.", re.DOTALL)
# an exception the engine re-threw around its own ("Code: 164. DB::Exception: Code: 164.
# DB::Exception: <text> (NAME) (version V). (NAME)") reads as a server's single one
_NESTED = re.compile(
    r"^Code: (\d+)\. DB::Exception: Code: \1\. DB::Exception: (.*?)\.?(?: \([A-Z_]+\))?"
    r"(?: \(version [^)]*\))?\.?\s*(\([A-Z_]+\))?$",
    re.DOTALL,
)
# every engine connection is the engine's own user ``default`` (chDB authenticates no other):
# that name in front of a message is not the HTTP user who asked, so it is left out
_ENGINE_USER = re.compile(r"^(Code: \d+\. DB::Exception: )default: ")


class EngineError(Exception):
    """A ClickHouse exception: numeric code, name and ClickHouse's own message."""

    status: int | None = None  # an HTTP status other than ClickHouse's mapping of the code

    def __init__(self, message: str, code: int | None = None, name: str | None = None) -> None:
        message = _SCOPE.sub(".", message.strip())
        nested = _NESTED.match(message)
        if nested:
            code_, text, named_ = nested.groups()
            message = f"Code: {code_}. DB::Exception: {text}. {named_ or ''}".rstrip()
        message = _ENGINE_USER.sub(r"\1", message)
        found = _CODE.search(message)
        self.code = code if code is not None else int(found.group(1)) if found else 1001
        named = _NAME.search(message)
        self.name = name or (named.group(1) if named else "STD_EXCEPTION")
        if not message.startswith("Code:"):
            message = f"Code: {self.code}. DB::Exception: {message}. ({self.name})"
        super().__init__(message)
        self.message = message


def too_large(size: int, limit: int) -> EngineError:
    """ClickHouse's answer to a result over ``max_result_bytes``; here it counts the bytes
    the answer would send (the engine's own count is of its blocks in memory)."""
    return EngineError(
        f"Limit for result exceeded, max bytes: {limit}, current bytes: {size} (the endpoint's "
        "limit on an answer, GPUGAP_CLICKHOUSE_SERVE_MAX_RESULT_BYTES)",
        396,
        "TOO_MANY_ROWS_OR_BYTES",
    )


def strip_wrapper(message: str) -> str:
    """An exception's text from its first ``Code:`` (chDB puts its own words in front)."""
    i = message.find("Code:")
    return message[i:] if i >= 0 else message
