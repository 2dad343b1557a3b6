"""What the HTTP alert targets share (Slack, webhooks): one client session per target, opened
after the ledger is read, and ``post``: one POST whose answer decides delivered, retry or
refused, with the receiver named in place of its URL (a URL may carry a token)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

import aiohttp
from yarl import URL

from gpugap.groundfloor import __version__
from gpugap.groundfloor.text import clean
from gpugap.schemas.errors import ConfigError, RetriableError
from gpugap.sinks.alerting import AlertTarget, Refused

#: how much of an answer's body is read and quoted in a refusal
ANSWER_MAX = 300
#: the longest Retry-After honoured before the base's backoff takes over
RETRY_AFTER_MAX_S = 60.0
RETRIABLE = frozenset({408, 425, 429})


def http_url(value: str, setting: str, *, show: bool = True) -> URL:
    """``value`` as an absolute http(s) URL, or a ConfigError naming ``setting`` (and the
    value, unless ``show`` is False: a URL that is a secret)."""
    try:
        url = URL(value)
    except (ValueError, TypeError):
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        shown = f"={value!r}" if show else ""
        raise ConfigError(f"{setting}{shown} is not an http:// or https:// URL")
    return url


def open_session(timeout_s: float) -> aiohttp.ClientSession:
    """The HTTP client of a webhook-like target: one per target, bounded by ``timeout_s`` a
    request, proxies from HTTPS_PROXY/NO_PROXY."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers={"User-Agent": f"gpugap/{__version__}"},
        trust_env=True,
    )


def _failure(exc: BaseException, timeout_s: float) -> str:
    """What went wrong, never with the URL (aiohttp puts it into some messages)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g}s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.strerror or type(exc).__name__}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    return type(exc).__name__


async def _head(resp: aiohttp.ClientResponse, size: int) -> bytes:
    """The first ``size`` bytes of the answer's body (an answer is never read whole)."""
    data = b""
    while len(data) < size:
        chunk = await resp.content.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


async def post(
    session: aiohttp.ClientSession,
    url: URL,
    body: bytes,
    headers: Mapping[str, str],
    *,
    what: str,
    timeout_s: float,
    stop: asyncio.Event,
) -> int:
    """POST ``body``; the status when it is 2xx. RetriableError when the receiver is down,
    slow or overloaded; Refused (with the status and the answer's first characters) when it
    refuses. ``what`` names the receiver in errors and logs, in place of its URL."""
    try:
        async with session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
            status = resp.status
            answer = clean((await _head(resp, ANSWER_MAX)).decode("utf-8", "replace"), ANSWER_MAX)
            retry_after = resp.headers.get("Retry-After", "")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        # `from None`: the cause's message may hold the URL (a secret for Slack)
        raise RetriableError(f"{what}: {_failure(exc, timeout_s)}") from None
    if 200 <= status < 300:
        return status
    said = f"{what} answered {status}" + (f": {answer}" if answer else "")
    if status in RETRIABLE or status >= 500:
        if retry_after.isdigit():
            # wait as asked (bounded), but never past a stop: the base re-raises then
            wait = min(float(retry_after), RETRY_AFTER_MAX_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            said += f" (Retry-After: {retry_after}s)"
        raise RetriableError(said)
    if 300 <= status < 400:
        said += " (a redirect: not followed, point the setting at the final URL)"
    raise Refused(said, status)


class HttpTarget(AlertTarget):
    """An alert target that POSTs: its session lives from ``start`` (after the ledger) to
    ``close``. Subclasses set ``timeout_s`` and use ``self._http``."""

    timeout_s: float = 10.0
    _http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        await super().start()  # the ledger first
        await self.open()

    async def open(self) -> None:
        """Open the HTTP session ``send`` uses (``start`` does, after reading the ledger)."""
        if self._http is None:
            self._http = open_session(self.timeout_s)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
