"""``gpugap record``: capture topics into JSONL in the envelope replay reads.

Valid records are written inline (their bytes as they were on the topic); anything that does
not decode as its topic's record is kept byte for byte as ``value_b64``, so a capture of a
topic with bad messages replays (with ``--keep-invalid``) to the same bytes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from typing import IO, Any

from gpugap.groundfloor.kafka.admin import ensure_topics
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import Topic, by_name, decode, encode
from gpugap.schemas.errors import ConfigError, InvalidRecord


def envelope(topic: Topic[Any], key: bytes | None, value: bytes | None) -> bytes:
    head = {"topic": topic.name, "key": None if key is None else key.decode(errors="replace")}
    try:
        record = decode(topic, value)
    except InvalidRecord:
        line = {**head, "value_b64": base64.b64encode(value or b"").decode()}
        return json.dumps(line, separators=(",", ":")).encode() + b"\n"
    assert value is not None
    if b"\n" in value or b"\r" in value:  # valid but pretty-printed: one line, please
        value = encode(record)
    return json.dumps(head, separators=(",", ":")).encode()[:-1] + b',"value":' + value + b"}\n"


async def record(
    settings: KafkaSettings,
    topics: Sequence[str],
    out: str,
    *,
    idle_timeout_s: float | None = None,
    stop: asyncio.Event | None = None,
) -> dict[str, int]:
    """Consume ``topics`` from the beginning into ``out`` until ``stop``, SIGINT/SIGTERM or
    ``idle_timeout_s`` without a message. Returns messages written per topic."""
    from aiokafka import AIOKafkaConsumer

    try:
        wanted = {settings.topic_prefix + by_name(t).name: by_name(t) for t in topics}
    except InvalidRecord as exc:
        raise ConfigError(f"record: {exc.reason}") from None
    await ensure_topics(settings, wanted)  # subscribing to a missing one logs an ERROR
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    counts: Counter[str] = Counter({t.name: 0 for t in wanted.values()})
    consumer = AIOKafkaConsumer(
        *wanted,
        **settings.client_options(),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    fh: IO[bytes] = sys.stdout.buffer if out == "-" else open(out, "wb")  # noqa: SIM115
    try:
        await consumer.start()
        idle_since = loop.time()
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            if not batches:
                if idle_timeout_s is not None and loop.time() - idle_since > idle_timeout_s:
                    break
                continue
            idle_since = loop.time()
            for tp, messages in batches.items():
                topic = wanted[tp.topic]
                for m in messages:
                    fh.write(envelope(topic, m.key, m.value))
                counts[topic.name] += len(messages)
            fh.flush()
    finally:
        await consumer.stop()
        if fh is not sys.stdout.buffer:
            fh.close()
        for sig in installed:
            loop.remove_signal_handler(sig)
    return dict(counts)
