"""One bounded, read-only client of Prometheus's HTTP API (``/api/v1/query``,
``/api/v1/query_range``): every request has a timeout, is retried with backoff on a
connection error, a timeout, 429 or a 5xx, and an answer larger than ``max_response_bytes``
is refused while it streams in. The bearer token is a ``SecretStr``, sent and never logged.
Errors name the part that asked (``who``) and what to change (``too_big``)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
from pydantic import SecretStr

from gpugap.schemas.errors import FatalError, RetriableError

log = logging.getLogger(__name__)


class PrometheusError(FatalError):
    """Prometheus refused a query, or its answer is not one the reader can use."""


class _Transient(RetriableError):
    pass


class PrometheusHttp:
    def __init__(
        self,
        url: str,
        *,
        who: str,
        bearer_token: SecretStr | None,
        timeout_s: float,
        retries: int,
        max_response_bytes: int,
        too_big: str,
    ) -> None:
        self.url = url.rstrip("/")
        self.who, self.too_big = who, too_big
        self.bearer_token = bearer_token
        self.timeout_s, self.retries, self.limit = timeout_s, retries, max_response_bytes
        self.queries = 0
        self._session: aiohttp.ClientSession | None = None

    async def query(self, form: dict[str, str], api: str = "query") -> dict[str, Any]:
        """The ``data`` of a successful answer (``api``: query or query_range)."""
        body = await self._post(form, api)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise PrometheusError(f"{self.who}: {self.url}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            what = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusError(f"{self.who}: {form.get('query')}: {what or 'no success'}")
        data = doc.get("data")
        return data if isinstance(data, dict) else {}

    async def _post(self, form: dict[str, str], api: str) -> bytes:
        delay = 1.0
        for attempt in range(self.retries + 1):
            try:
                return await self._fetch(form, api)
            except (aiohttp.ClientError, TimeoutError, _Transient) as exc:
                if attempt == self.retries:
                    raise PrometheusError(
                        f"{self.who}: {self.url}: {str(exc) or type(exc).__name__} "
                        f"({attempt + 1} tries)"
                    ) from None
                log.warning("%s: %s: %s; again in %.0fs", self.who, self.url, exc, delay)
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    async def _fetch(self, form: dict[str, str], api: str) -> bytes:
        self.queries += 1
        async with self._open().post(f"{self.url}/api/v1/{api}", data=form) as resp:
            if resp.status >= 500 or resp.status == 429:  # 503: not ready (yet)
                raise _Transient(f"HTTP {resp.status}")
            if resp.status in (401, 403):
                raise PrometheusError(
                    f"{self.who}: {self.url}: HTTP {resp.status} (the bearer token?)"
                )
            if resp.content_length is not None and resp.content_length > self.limit:
                raise self._too_big(f"an answer of {resp.content_length} bytes >")
            chunks, size = [], 0
            async for chunk in resp.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > self.limit:
                    raise self._too_big("an answer larger than")
                chunks.append(chunk)
            body = b"".join(chunks)
            if resp.status != 200 and not body.lstrip().startswith(b"{"):
                raise PrometheusError(f"{self.who}: {self.url}: HTTP {resp.status}")
            return body

    def _too_big(self, what: str) -> PrometheusError:
        return PrometheusError(
            f"{self.who}: {what} max_response_bytes {self.limit}: {self.too_big}"
        )

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"Accept": "application/json"}
            if self.bearer_token is not None:
                headers["Authorization"] = f"Bearer {self.bearer_token.get_secret_value()}"
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s), headers=headers
            )
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
