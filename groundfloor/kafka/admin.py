"""What every Kafka client here does before it first touches a topic or a consumer group.

A fresh broker creates a topic the first time a client names it (``auto.create.topics.enable``)
and its offsets topic on the first group request, but the client that triggered it is told
"not there" first and aiokafka logs that at ERROR (``aiokafka.cluster``: "Topic ... not found
in cluster metadata"; ``aiokafka.consumer.group_coordinator``: "Group Coordinator Request
failed: ... GroupCoordinatorNotAvailableError") in runs that then work. So producers, the
workers and the sinks call :func:`ensure_topics` (create what is missing, never change what
exists) and consumers :func:`wait_for_coordinator` first.

Safe on a real cluster: topics are created only where they are missing, with the broker's own
defaults (``num.partitions``, ``default.replication.factor``: what auto-creation would have
used) unless the caller needs otherwise; a principal without the right to create topics gets
one WARNING saying they must exist, and carries on (the client's own errors follow if they
really are missing).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpugap.groundfloor.settings import KafkaSettings

log = logging.getLogger(__name__)

#: (bootstrap, topic) known to exist, or not ours to create (refused): asked once per process
_settled: set[tuple[str, str]] = set()

#: how long a new topic may take to get its partition leaders, a fresh broker its coordinator
READY_TIMEOUT_S = 15.0

_DENIED = (29, 31)  # TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED
_EXISTS = 36  # TOPIC_ALREADY_EXISTS


async def ensure_topics(
    settings: KafkaSettings,
    names: Iterable[str],
    *,
    partitions: int | None = None,
    configs: Mapping[str, str] | None = None,
) -> list[str]:
    """Create those of ``names`` (broker names, prefix included) the broker lacks; returns
    the ones created. Idempotent: existing topics are left exactly as they are.

    ``partitions``/``configs`` apply to topics created here (default: the broker's
    ``num.partitions``, no topic configs); the replication factor is the broker's
    ``default.replication.factor``. Returns once their partitions have leaders, so the
    client's first metadata request finds them."""
    wanted = sorted({n for n in names if (settings.bootstrap, n) not in _settled})
    if not wanted:
        return []
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(**settings.client_options())
    try:
        await admin.start()
        # all topics (a metadata request naming missing ones would auto-create them)
        existing = set(await admin.list_topics())
        missing = [n for n in wanted if n not in existing]
        _settled.update((settings.bootstrap, n) for n in wanted if n in existing)
        if not missing:
            return []
        created = await _create(admin, settings, missing, partitions, configs or {})
        if created:
            leaders = await _wait_for_leaders(admin, created)
            await _wait_for_offsets(settings, leaders)
        return created
    except (KafkaError, TimeoutError, OSError) as exc:
        # unreachable, timed out: the client that needs the topics meets (and reports) it next
        log.debug("could not check Kafka topics %s: %r", ", ".join(wanted), exc)
        return []
    finally:
        await admin.close()


async def _create(
    admin: Any,
    settings: KafkaSettings,
    names: list[str],
    partitions: int | None,
    configs: Mapping[str, str],
) -> list[str]:
    from aiokafka.admin import NewTopic
    from aiokafka.errors import for_code

    default_partitions, replicas = await _broker_defaults(admin)
    count = partitions or default_partitions
    response = await admin.create_topics(
        [NewTopic(n, count, replicas, topic_configs=dict(configs)) for n in names]
    )
    created, denied = [], []
    for error in response.topic_errors:
        name, code = error[0], error[1]
        message = error[2] if len(error) > 2 else None
        if code == 0:
            created.append(name)
        elif code == _EXISTS:  # another client was quicker: fine
            _settled.add((settings.bootstrap, name))
        elif code in _DENIED:
            denied.append(name)
        else:  # not ours to hide: the client that needs the topic fails on it next
            log.warning(
                "could not create Kafka topic %s: %s%s",
                name,
                for_code(code).__name__,
                f" ({message})" if message else "",
            )
    if denied:
        _settled.update((settings.bootstrap, n) for n in denied)
        log.warning(
            "not allowed to create Kafka topics (%s): they must exist before use; "
            "ask the cluster's administrators to create them",
            ", ".join(denied),
        )
    if created:
        _settled.update((settings.bootstrap, n) for n in created)
        log.info(
            "created Kafka topics %s (%d partition(s), replication factor %d)",
            ", ".join(created),
            count,
            replicas,
        )
    return created


async def _broker_defaults(admin: Any) -> tuple[int, int]:
    """(num.partitions, default.replication.factor) of the broker: what auto-creation would
    have used. Without the right to read them: 1 partition, min(3, brokers) replicas."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
    from aiokafka.errors import KafkaError

    cluster = await admin.describe_cluster()
    brokers = [b["node_id"] for b in cluster.get("brokers") or ()]
    fallback = (1, max(1, min(3, len(brokers))))
    if not brokers:
        return fallback
    keys = {"num.partitions": None, "default.replication.factor": None}
    try:
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(brokers[0]), keys)]
        )
    except (KafkaError, ValueError):
        return fallback
    found: dict[str, int] = {}
    for resource in response.resources:
        if resource[0]:  # error_code: e.g. not allowed to describe the cluster's configs
            return fallback
        for entry in resource[4]:
            if entry[0] in keys and entry[1] is not None:
                found[entry[0]] = int(entry[1])
    return (
        max(1, found.get("num.partitions", fallback[0])),
        max(1, min(found.get("default.replication.factor", fallback[1]), len(brokers))),
    )


async def _wait_for_leaders(admin: Any, names: list[str]) -> dict[str, int]:
    """Wait until the metadata names a leader for every partition of ``names``; returns
    topic -> partition count (empty if they did not get leaders in time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT_S
    while loop.time() < deadline:
        described = await admin.describe_topics(names)  # they exist now: creates nothing
        if len(described) == len(names) and all(
            not d.get("error_code")
            and d.get("partitions")
            and all(p.get("leader", -1) >= 0 for p in d["partitions"])
            for d in described
        ):
            return {d["topic"]: len(d["partitions"]) for d in described}
        await asyncio.sleep(0.1)
    return {}


async def _wait_for_offsets(settings: KafkaSettings, partitions: Mapping[str, int]) -> None:
    """Wait until the leaders answer ListOffsets for every new partition. KRaft publishes
    a new partition's leader in the metadata a moment before that broker serves it, and a
    consumer resetting its position meanwhile logs "Failed fetch offsets ...
    NotLeaderForPartitionError" at ERROR (aiokafka's fetcher) before it retries; asking
    here, through ``end_offsets``, retries the same answer quietly."""
    if not partitions:
        return
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    tps = [TopicPartition(t, p) for t, count in partitions.items() for p in range(count)]
    consumer = AIOKafkaConsumer(**settings.client_options(), enable_auto_commit=False)
    try:
        await consumer.start()
        await asyncio.wait_for(consumer.end_offsets(tps), READY_TIMEOUT_S)
    except (KafkaError, TimeoutError) as exc:  # the client that needs them meets it next
        log.debug("new topics' offsets not readable yet: %r", exc)
    finally:
        await consumer.stop()


async def wait_for_coordinator(settings: KafkaSettings, group: str) -> None:
    """Return once the broker can coordinate ``group`` (a fresh broker first creates its
    offsets topic, and answers "coordinator not available" meanwhile), or after
    READY_TIMEOUT_S. Other errors (not allowed to use the group, ...) are left to the
    consumer, which reports them itself."""
    if (settings.bootstrap, "group:" + group) in _settled:
        return
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import (
        GroupCoordinatorNotAvailableError,
        GroupLoadInProgressError,
        KafkaError,
        NotCoordinatorForGroupError,
    )

    transient = (
        GroupCoordinatorNotAvailableError,
        GroupLoadInProgressError,
        NotCoordinatorForGroupError,
    )
    admin = AIOKafkaAdminClient(**settings.client_options())
    try:
        await admin.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        while True:
            try:
                await admin.list_consumer_group_offsets(group)
                break
            except transient:
                if loop.time() > deadline:
                    return
                await asyncio.sleep(0.2)
        _settled.add((settings.bootstrap, "group:" + group))
    except (KafkaError, TimeoutError, OSError) as exc:
        log.debug("could not look up the coordinator of group %s: %r", group, exc)
    finally:
        await admin.close()


async def prepare(settings: KafkaSettings, topics: Iterable[str], group: str | None) -> None:
    """A consumer's start: its topics (broker names) exist, its group can be joined."""
    await ensure_topics(settings, topics)
    if group is not None:
        await wait_for_coordinator(settings, group)


async def partition_counts(settings: KafkaSettings, names: Iterable[str]) -> dict[str, int]:
    """How many partitions each of ``names`` has (those that exist)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**settings.client_options())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [n for n in names if n in existing]
        out = {}
        for d in await admin.describe_topics(wanted) if wanted else []:
            parts = d.get("partitions") or ()
            if not d.get("error_code") and parts:
                out[d["topic"]] = len(parts)
        return out
    finally:
        await admin.close()
