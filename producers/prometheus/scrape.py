"""The scrape loop every exporter scraper shares (``gpugap produce dcgm``, ``amd-exporter``).

Every round scrapes all endpoints at once (aiohttp, one connection pool, a total timeout per
scrape), hands each answer to the subclass's pure ``parse`` and publishes one ``NodeSample``
per node. An endpoint that is down, slow or answers an error status costs only its own
sample: it is logged when it goes down and when it comes back. A scrape that arrives but
cannot be used (``ScrapeError``: not the text format, a value out of range, a label missing)
becomes one ``DeadLetter`` on ``dead-letter.v1`` carrying the body, plus a log line.

Read-only: plain GETs of ``/metrics``, nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from abc import abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

import aiohttp

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.producers.prometheus.settings import ScrapeSettings
from gpugap.producers.prometheus.text import ScrapeError
from gpugap.schemas import DeadLetter, NodeSample, Record, Topic, utc_now
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.topics import DEAD_LETTER, SAMPLES
from gpugap.schemas.types import DeadLetterKind

#: the most of a bad scrape kept in its dead letter (a Kafka message has ~1 MiB, base64 4/3)
DEAD_LETTER_BODY = 512 << 10


class Unreachable(Exception):
    """The endpoint gave no usable answer (an error status, a body over the limit)."""


def endpoint_url(text: str, who: str, example: str) -> str:
    """'host:9400' -> 'http://host:9400/metrics'; a full URL is kept as given."""
    url = text.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if not parts.hostname:
        raise ConfigError(f"{who}: {text!r} is not an endpoint (expected {example})")
    return url if parts.path not in ("", "/") else url.rstrip("/") + "/metrics"


class ScrapeProducer(Producer):
    """Subclasses name themselves (``name``, ``exporter``, ``example_endpoint``,
    ``env_prefix``) and map one scrape's text to node samples in ``parse``."""

    #: what is scraped, as reasons and logs name it ("dcgm-exporter")
    exporter: ClassVar[str]
    #: an endpoint as the error for a missing or bad one shows it
    example_endpoint: ClassVar[str]
    #: the settings' environment prefix ("GPUGAP_DCGM_")
    env_prefix: ClassVar[str]

    def __init__(self, settings: Settings, cfg: ScrapeSettings) -> None:
        super().__init__(settings)
        self.cfg = cfg
        self.log = logging.getLogger(type(self).__module__)
        if not cfg.endpoints:
            raise ConfigError(
                f"{self.name}: no endpoint to scrape: pass --endpoint URL (repeat it for more) "
                f"or set {self.env_prefix}ENDPOINTS={self.example_endpoint},..."
            )
        self.endpoints = list(
            dict.fromkeys(endpoint_url(e, self.name, self.example_endpoint) for e in cfg.endpoints)
        )
        self.cluster = cfg.cluster or settings.cluster
        self.interval_s = cfg.interval_s
        self.counts: Counter[str] = Counter()
        self.last_round_s = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._trouble: dict[str, str] = {}  # endpoint -> what was last logged about it

    @abstractmethod
    def parse(self, text: str, default_node: str) -> Sequence[NodeSample]:
        """One scrape's node samples (pure). Raises ScrapeError."""

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SAMPLES

    async def emit(self, record: Record, topic: Topic[Any] | None = None) -> None:
        # poll() hands back samples and dead letters together; each goes to its own topic
        await super().emit(record, DEAD_LETTER if isinstance(record, DeadLetter) else topic)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.cfg.max_concurrency),
                timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s),
                headers={"Accept": "text/plain;version=0.0.4"},
            )
        return self._session

    async def poll(self) -> Iterable[Record]:
        session = self._open()
        loop = asyncio.get_running_loop()
        started = loop.time()
        rounds = await asyncio.gather(*(self._scrape(session, url) for url in self.endpoints))
        self.last_round_s = loop.time() - started
        return [record for records in rounds for record in records]

    async def _scrape(self, session: aiohttp.ClientSession, url: str) -> list[Record]:
        try:
            body = await self._fetch(session, url)
        except (aiohttp.ClientError, TimeoutError, Unreachable) as exc:
            self.counts["unreachable"] += 1
            self._say(url, f"unreachable: {str(exc) or type(exc).__name__}")
            return []
        try:
            samples = self.parse(body.decode("utf-8"), urlsplit(url).hostname or url)
        except UnicodeDecodeError as exc:
            return [self._dead_letter(url, body, DeadLetterKind.MALFORMED, f"not UTF-8: {exc}")]
        except ScrapeError as exc:
            return [self._dead_letter(url, body, exc.kind, exc.reason)]
        except Exception as exc:  # a bug of ours on odd input: keep the body, keep going
            self.log.exception("%s: %s: cannot map this scrape", self.name, url)
            reason = f"cannot map the scrape ({type(exc).__name__}: {exc})"
            return [self._dead_letter(url, body, DeadLetterKind.REJECTED, reason)]
        self.counts["scraped"] += 1
        self._say(url, "")
        return list(samples)

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> bytes:
        limit = self.cfg.max_body_bytes
        async with session.get(url) as resp:
            if resp.status != 200:
                raise Unreachable(f"HTTP {resp.status}")
            if resp.content_length is not None and resp.content_length > limit:
                raise Unreachable(f"scrape of {resp.content_length} bytes > {limit}")
            chunks, size = [], 0
            async for chunk in resp.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > limit:
                    raise Unreachable(f"scrape larger than {limit} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

    def _dead_letter(self, url: str, body: bytes, kind: DeadLetterKind, reason: str) -> DeadLetter:
        self.counts["dead_lettered"] += 1
        kept = body[:DEAD_LETTER_BODY]
        if len(kept) < len(body):
            reason += f" (body cut to its first {len(kept)} of {len(body)} bytes)"
        self._say(url, f"scrape refused ({kind.value}): {reason}")
        return DeadLetter(
            time=utc_now(),
            source_topic=SAMPLES.name,
            key_b64=base64.b64encode(url.encode()).decode(),
            value_b64=base64.b64encode(kept).decode(),
            kind=kind,
            reason=f"{self.exporter} {url}: {reason}"[:4000],
            consumer=f"producer-{self.name}",
        )

    def _say(self, url: str, trouble: str) -> None:
        """Log a change of an endpoint's state, once (a dead node is not news every round)."""
        before = self._trouble.get(url, "")
        if trouble == before:
            return
        if trouble:
            self.log.warning("%s: %s %s", self.name, url, trouble)
            self._trouble[url] = trouble
        else:
            self.log.warning("%s: %s is back", self.name, url)
            del self._trouble[url]

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
