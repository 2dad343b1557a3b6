"""The one error module: every gpugap error says whether retrying can help.

Retriable errors (a broker or warehouse that is down, a timeout) are retried with backoff
by the part that hit them; fatal errors (bad configuration, a missing tool) stop the command
with a message that says what to do; invalid records are data: they go to the dead-letter
topic with their reason and processing goes on.
"""

from __future__ import annotations


class GpugapError(Exception):
    """Base of every error gpugap raises on purpose."""


class RetriableError(GpugapError):
    """A transient failure: the same call may succeed later (broker down, timeout)."""


class RecordsLost(RetriableError):
    """Kafka refused (or never got) records a publisher had taken: they are lost unless sent
    again. The publisher refuses every later call until ``reopen()``; the caller sends again
    from what it still holds (its input, its last checkpoint)."""


class FatalError(GpugapError):
    """A failure that retrying cannot fix; the message says what to change."""


class ConfigError(FatalError):
    """Configuration is missing or contradictory."""


class ServiceError(FatalError):
    """A local service (Kafka, ClickHouse endpoint) could not be started or stopped."""


class InvalidRecord(GpugapError):
    """A record that cannot be decoded or validated. ``reason`` names the problem and field."""

    kind = "invalid"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MalformedRecord(InvalidRecord):
    """The bytes are not a JSON document at all."""

    kind = "malformed"


class SchemaViolation(InvalidRecord):
    """Valid JSON that breaks the topic's schema (wrong type, out of range, naive time...)."""

    kind = "schema"


class UnknownTopic(InvalidRecord):
    """A topic, or a version of one, that this build does not know."""

    kind = "unknown_topic"
