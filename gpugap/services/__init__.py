"""Local services for machines without Docker: a Kafka broker (and later the warehouse)."""
