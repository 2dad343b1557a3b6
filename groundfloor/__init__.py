"""The ground floor every part of gpugap stands on: settings, the plugin seam, the Kafka client
layer, workload classification, the SQL lexer, time arguments and the GPU rate card.

It imports only `schemas`; producers, streams, sinks and the application build on it."""

__version__ = "0.1.0"
