"""Who a request says it is, by ClickHouse's rules (authenticateUserByHTTP): the
X-ClickHouse-User/X-ClickHouse-Key headers, else HTTP Basic, else the ``user``/``password``
parameters (user ``default`` when none is given). Mixing two of those ways is refused, as is a
quota key given both as X-ClickHouse-Quota and as ``quota_key``; a quota key is accepted and
has no effect (the embedded endpoint has no quotas to key)."""

from __future__ import annotations

import base64
from collections.abc import Mapping

from gpugap.warehouse.embedded.errors import EngineError


def failed(message: str) -> EngineError:
    return EngineError(message, 516, "AUTHENTICATION_FAILED")


def _mixed(one: str, other: str) -> EngineError:
    return failed(
        f"Invalid authentication: it is not allowed to use {one} and {other} simultaneously"
    )


def credentials(headers: Mapping[str, str], params: Mapping[str, str]) -> tuple[str, str]:
    """(user, password) as the request gives them."""
    name = headers.get("X-ClickHouse-User", "")
    password = headers.get("X-ClickHouse-Key", "")
    authorization = headers.get("Authorization", "")
    in_params = "user" in params or "password" in params
    if name or password:
        if not name:
            raise failed("Got an empty user name from X-ClickHouse HTTP headers")
        if authorization:
            raise _mixed("X-ClickHouse HTTP headers", "Authorization HTTP header")
        if in_params:
            raise _mixed("X-ClickHouse HTTP headers", "authentication via parameters")
    elif authorization:
        if in_params:
            raise _mixed("Authorization HTTP header", "authentication via parameters")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "basic":
            raise failed(
                f"Invalid authentication: '{scheme}' HTTP Authorization scheme is not supported"
            )
        try:
            name, _, password = base64.b64decode(token.strip()).decode().partition(":")
        except ValueError:
            raise failed("Malformed Authorization header") from None
        if not name:
            raise failed("Got an empty user name from Authorization HTTP header")
    else:
        name, password = params.get("user", "default"), params.get("password", "")
        if not name:
            raise failed("Got an empty user name from authentication via parameters")
    if "quota_key" in params and headers.get("X-ClickHouse-Quota"):
        raise EngineError(
            "Invalid authentication: it is not allowed to use quota key as HTTP header and as "
            "parameter simultaneously",
            36,
            "BAD_ARGUMENTS",
        )
    return name, password
