"""``gpugap slurm-hook drain``: ship the events the hook spooled while Kafka was unreachable.

Runs anywhere the spool directory is (the slurmctld host): once (cron, a systemd timer, by
hand) or with ``--follow``. The poller does the same on every tick when it runs there. Uses
the project's Kafka publisher (aiokafka: TLS/SASL, idempotent, acks=all). A spooled envelope
that is not a valid record goes to the dead-letter topic instead of blocking the rest; a file
is deleted only after the broker acknowledged it, so a crash mid-way loses nothing (at worst
an event is sent twice, with the same event_id). Like the hook it reads no spool that is a
symbolic link or that others can write (anyone who can put a file there could forge events),
and opens no file through a link (producers/slurm/spool.py).

What the spool holds is not only job events: a prolog that could not read its job from
scontrol in time spools a dead letter where the start event would be. The drainer says how
many records it shipped to each topic, so "shipped 40" is never read as 40 job events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path

from gpugap.groundfloor.kafka.consume import DeadLetters, RawMessage
from gpugap.groundfloor.kafka.publish import KafkaPublisher, Publisher
from gpugap.producers.slurm import spool
from gpugap.producers.slurm.event import encode
from gpugap.schemas import by_name, decode
from gpugap.schemas.errors import GpugapError, InvalidRecord, RetriableError
from gpugap.schemas.types import DeadLetterKind

log = logging.getLogger(__name__)
START_TTL_S = 30 * 86400  # start records of jobs whose end never came


async def drain_once(
    root: str | Path,
    publisher: Publisher,
    dead: DeadLetters,
    limit: int = 10_000,
    by_topic: Counter[str] | None = None,
) -> int:
    """Ship up to ``limit`` spooled events; returns how many were shipped, and adds them to
    ``by_topic`` per topic (spooled names, without the deployment's prefix)."""
    root = str(root)
    # the drainer may run as root over the hook's spool (SlurmUser's): either owner is fine,
    # a link or a directory others can write is not (UnsafeSpool, an OSError)
    spool.check(root, owners=(os.geteuid(), 0))
    spool.recover(root)
    claimed: list[str] = []
    shipped: Counter[str] = Counter()
    try:
        for path in spool.pending(root)[:limit]:
            c = spool.claim(path)
            if c is None:
                continue
            claimed.append(c)
            try:
                data = spool.read_bytes(c)  # never through a link, never a FIFO
            except OSError as exc:
                log.warning("slurm spool: cannot read %s (%s): left where it is", path, exc)
                claimed.remove(c)
                spool.unclaim(c)
                continue
            try:
                env = json.loads(data)
                topic = by_name(env["topic"])
                value = encode(env["value"])
                decode(topic, value)  # never ship what the schema refuses
            except (ValueError, KeyError, TypeError, InvalidRecord) as exc:
                kind = DeadLetterKind(getattr(exc, "kind", "malformed"))
                msg = RawMessage(f"spool:{root}", None, None, None, data)
                await dead.route(msg, f"spooled file {os.path.basename(path)}: {exc}", kind)
                log.warning("slurm spool: %s is not a valid record (%s): dead-lettered", path, exc)
                continue
            key = str(env.get("key") or topic.key_of(decode(topic, value))).encode()
            await publisher.send_encoded(topic, key, value, env.get("timestamp_ms"))
            shipped[topic.name] += 1
        await publisher.flush()
    except BaseException:
        for c in claimed:
            spool.unclaim(c)
        raise
    for c in claimed:
        spool.release(c)
    spool.prune_starts(root, START_TTL_S)
    if by_topic is not None:
        by_topic.update(shipped)  # only once acknowledged: a failed flush counted nothing
    return sum(shipped.values())


async def _run(root: Path, follow: bool, interval: float, by_topic: Counter[str]) -> int:
    from gpugap.groundfloor.settings import load

    settings = load()
    total = 0
    while True:
        try:
            async with KafkaPublisher(settings.kafka) as pub:
                dead = DeadLetters(pub, "slurm-hook-drain", settings.kafka.topic_prefix)
                while True:
                    tick: Counter[str] = Counter()
                    n = await drain_once(root, pub, dead, by_topic=tick)
                    total += n
                    by_topic.update(tick)
                    if n:
                        log.info("slurm spool: shipped %d event(s): %s", n, _split(tick))
                    if not follow:
                        return total
                    await asyncio.sleep(interval)
        except RetriableError as exc:
            if not follow:
                raise
            log.warning("slurm spool: %s; retrying in %.0fs", exc, interval)
            await asyncio.sleep(interval)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="gpugap slurm-hook drain", description="ship the events the Slurm hook spooled"
    )
    p.add_argument("--spool-dir", help="default: GPUGAP_SLURM_SPOOL_DIR")
    p.add_argument("--follow", action="store_true", help="keep running, drain every --interval")
    p.add_argument("--interval", type=float, default=10.0, metavar="S")
    args = p.parse_args(argv)
    from gpugap.groundfloor import logs
    from gpugap.producers.slurm.settings import SlurmSettings

    root = Path(args.spool_dir) if args.spool_dir else SlurmSettings().spool_dir
    logs.configure(logging.INFO)
    by_topic: Counter[str] = Counter()
    try:
        spool.check(str(root), owners=(os.geteuid(), 0))  # refused before Kafka is asked
        total = asyncio.run(_run(root, args.follow, args.interval, by_topic))
    except KeyboardInterrupt:
        return 130
    except GpugapError as exc:  # e.g. Kafka still unreachable: the files stay for next time
        print(f"gpugap slurm-hook drain: {exc}", file=sys.stderr)
        return 2
    except spool.UnsafeSpool as exc:  # a link, or a directory others can write: refused
        print(f"gpugap slurm-hook drain: {exc}", file=sys.stderr)
        return 2
    print(
        f"shipped {total} spooled event(s) from {root}" + (f": {_split(by_topic)}" if total else "")
    )
    return 0


def _split(by_topic: Counter[str]) -> str:
    """``39 to slurm.jobs.v1, 1 to dead-letter.v1``: job events first."""
    order = sorted(by_topic, key=lambda t: (t != "slurm.jobs.v1", t))
    return ", ".join(f"{by_topic[t]} to {t}" for t in order)
