"""Local services for machines without Docker: a Kafka broker (the embedded ClickHouse
endpoint is warehouse/embedded)."""
