"""Who may publish for a cluster: topics whose records may claim only certain clusters.

Kafka does not tell a consumer who wrote a record: the principal that produced it is known
to the broker (which checks its write ACL) and to nobody downstream, and a record header
(``cluster: cluster-a``) is whatever the producer chose to write. What a consumer does know
is the topic it read a record from. So the trust boundary is drawn with topics:

- the broker lets each cluster's producer principal write its own topics only (ACLs,
  ``deploy/kafka-acls/``);
- ``GPUGAP_KAFKA_CLUSTER_TOPICS`` tells the consumers which cluster(s) each such topic may
  speak for. A record on a mapped topic that claims another cluster is a dead letter
  (kind ``untrusted``), and a mapped cluster is claimed on its own topics only: the same
  claim on any other topic of that kind (the shared ``gpu.samples.v1`` included) is a dead
  letter too, so write access to a shared topic does not reach a mapped cluster either.

Applied where every consumer decodes (``DeadLetters.decode``): both worker engines and the
sinks. Without the setting nothing changes. See docs/kafka-trust.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gpugap.schemas import Record, Topic, by_name

if TYPE_CHECKING:
    from gpugap.groundfloor.settings import KafkaSettings

__all__ = ["ClusterTrust"]


class ClusterTrust:
    """The clusters the records of each topic may claim (broker names, prefix included)."""

    def __init__(self, topics: Mapping[str, tuple[str, frozenset[str]]], prefix: str = "") -> None:
        self.prefix = prefix
        #: broker topic -> (the schema's topic, the clusters its records may claim)
        self.topics: dict[str, tuple[Topic[Any], frozenset[str]]] = {
            name: (by_name(schema), clusters) for name, (schema, clusters) in topics.items()
        }
        #: schema topic name -> cluster -> the broker topics that may claim it
        self.owned: dict[str, dict[str, list[str]]] = {}
        for name, (schema, clusters) in sorted(self.topics.items()):
            for c in clusters:
                self.owned.setdefault(schema.name, {}).setdefault(c, []).append(name)

    @classmethod
    def from_settings(cls, kafka: KafkaSettings) -> ClusterTrust | None:
        """The mapping of ``GPUGAP_KAFKA_CLUSTER_TOPICS``; None when there is none."""
        mapping = kafka.cluster_topic_map()
        return cls(mapping, kafka.topic_prefix) if mapping else None

    def schema(self, topic: str) -> Topic[Any] | None:
        """The record schema of a mapped topic (None: not mapped)."""
        found = self.topics.get(topic)
        return found[0] if found is not None else None

    def topics_for(self, schemas: Iterable[Topic[Any]]) -> list[str]:
        """The mapped broker topics that carry records of ``schemas``: a consumer's inputs
        beside the schemas' own topics (which it reads anyway, mapped or not)."""
        names = {s.name for s in schemas}
        own = {s.qualified(self.prefix) for s in schemas}
        return sorted(
            t for t, (schema, _) in self.topics.items() if schema.name in names and t not in own
        )

    def refuse(self, topic: str, schema: Topic[Any], record: Record) -> str | None:
        """Why ``record`` (read from broker topic ``topic``, of ``schema``) may not claim its
        cluster, or None when it may."""
        cluster = getattr(record, "cluster", None)
        if not isinstance(cluster, str):
            return None  # a record that speaks for no cluster
        mapped = self.topics.get(topic)
        if mapped is not None:
            allowed = mapped[1]
            if cluster in allowed:
                return None
            return (
                f"cluster trust: records on {topic} may claim cluster "
                f"{' or '.join(map(repr, sorted(allowed)))} only (GPUGAP_KAFKA_CLUSTER_TOPICS); "
                f"this one claims {cluster!r}"
            )
        own = self.owned.get(schema.name, {}).get(cluster)
        if own is None:
            return None  # a cluster nobody mapped: the shared topics speak for it
        return (
            f"cluster trust: {schema.name} records of cluster {cluster!r} are accepted on "
            f"{', '.join(own)} only (GPUGAP_KAFKA_CLUSTER_TOPICS), not on {topic}"
        )
