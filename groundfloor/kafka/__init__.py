"""The Kafka base: the publisher, the dead-letter consumer, topic administration."""
