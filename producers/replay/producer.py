"""``gpugap replay``: publish a JSONL capture (``{"topic","key","value"}`` per line, or
``value_b64`` for bytes that were not a valid record) back to its topics, with the captured
keys and each record's event time as the Kafka timestamp.

Every line is validated through ``schemas.codec``. A bad line (not JSON, unknown topic, a
record that breaks its schema) is reported on stderr with its line number and skipped; with
``strict`` the first one stops the replay with an error; with ``keep_invalid`` invalid
records of a known topic are published verbatim (to exercise a dead-letter path). Pacing:
``speed`` event-time seconds per wall second from the first record on, or none at all.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar

from gpugap.groundfloor.kafka.publish import event_time_ms
from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.schemas import Record, Topic, by_name, decode, encode
from gpugap.schemas.errors import FatalError, InvalidRecord
from gpugap.schemas.topics import SAMPLES

MAX_REPORTED = 100


class BadLine(FatalError):
    """A line of a capture that is not a valid record (raised under ``--strict``)."""


class InvalidLine(Exception):
    def __init__(
        self,
        reason: str,
        topic: Topic[Any] | None = None,
        key: str | None = None,
        data: bytes | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason, self.topic, self.key, self.data = reason, topic, key, data


def parse_line(line: bytes) -> tuple[Topic[Any], str | None, Record]:
    """(topic, key, record) of one envelope line, or InvalidLine saying what is wrong."""
    try:
        env = json.loads(line)
    except ValueError as exc:
        raise InvalidLine(f"not JSON ({exc})") from None
    if not isinstance(env, dict):
        raise InvalidLine("not a JSON object")
    name = env.get("topic")
    if not isinstance(name, str):
        raise InvalidLine("no 'topic' string")
    try:
        topic = by_name(name)
    except InvalidRecord as exc:
        raise InvalidLine(exc.reason) from None
    key = env.get("key")
    if key is not None and not isinstance(key, str):
        raise InvalidLine("'key' must be a string or null", topic)
    if "value_b64" in env:
        try:
            data = base64.b64decode(env["value_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise InvalidLine("'value_b64' is not base64", topic, key) from None
    elif "value" in env:
        data = json.dumps(env["value"], separators=(",", ":"), ensure_ascii=False).encode()
    else:
        raise InvalidLine("no 'value' or 'value_b64'", topic, key)
    try:
        return topic, key, decode(topic, data)
    except InvalidRecord as exc:
        raise InvalidLine(exc.reason, topic, key, data) from None


class Replay(Producer):
    name: ClassVar[str] = "replay"

    def __init__(
        self,
        settings: Settings,
        path: str | Path,
        *,
        speed: float | None = None,
        strict: bool = False,
        keep_invalid: bool = False,
        errors: IO[str] | None = None,
    ) -> None:
        super().__init__(settings)
        self.path = str(path)
        self.speed = speed
        self.strict = strict
        self.keep_invalid = keep_invalid
        self.errors = errors or sys.stderr
        self.replayed = self.bad = self.kept = 0

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return SAMPLES

    def _lines(self) -> Iterator[tuple[int, bytes]]:
        with contextlib.ExitStack() as stack:
            fh = (
                sys.stdin.buffer if self.path == "-" else stack.enter_context(open(self.path, "rb"))
            )
            for n, line in enumerate(fh, 1):
                if line.strip():
                    yield n, line

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        pub = self.publisher
        assert pub is not None
        loop = asyncio.get_running_loop()
        first: tuple[float, int] | None = None  # (wall, event time ms) of the first record
        for n, line in self._lines():
            if stop.is_set():
                break
            if n % 256 == 0:
                await asyncio.sleep(0)  # let the Kafka client's tasks and signals in
            try:
                topic, key, record = parse_line(line)
            except InvalidLine as exc:
                await self._bad(n, exc)
                continue
            ts = event_time_ms(record)
            if self.speed is not None and ts is not None:
                if first is None:
                    first = (loop.time(), ts)
                ahead = first[0] + (ts - first[1]) / 1000 / self.speed - loop.time()
                if ahead > 0.002:
                    await pub.flush()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), ahead)
            raw_key = key.encode() if key is not None else topic.key_for(record)
            await pub.send_encoded(topic, raw_key, encode(record), ts)
            self.replayed += 1

    async def _bad(self, n: int, exc: InvalidLine) -> None:
        self.bad += 1
        where = f"{self.path} line {n}: {exc.reason}"
        if self.strict:
            raise BadLine(where + " (--strict)")
        if self.bad <= MAX_REPORTED:
            print(f"replay: {where} (skipped)", file=self.errors)
        elif self.bad == MAX_REPORTED + 1:
            print("replay: further bad lines are counted, not shown", file=self.errors)
        if self.keep_invalid and exc.topic is not None and exc.data is not None:
            assert self.publisher is not None
            key = exc.key.encode() if exc.key is not None else None
            await self.publisher.send_raw(self.publisher.topic_name(exc.topic), key, exc.data)
            self.kept += 1
