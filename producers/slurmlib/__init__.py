"""Slurm producer internals: parsers for what Slurm prints, the event builder, the hook's
Kafka wire client. Standard library only: the hook imports these on every job start and end,
so nothing heavy (pydantic, aiokafka) may be imported here."""
