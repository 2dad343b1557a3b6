"""Queue time, Slurm's real currency: how long jobs and pods waited for GPUs (measured, in the
warehouse's ``v_queue_wait``), and what padded time limits cost everyone else who waits (a
partition's recorded jobs replayed through an EASY-backfill model with the limits asked for and
right-sized). docs/queue.md says how it is computed and what it assumes.

- ``backfill``: the scheduler model, pure (``replay``);
- ``cost``: the two replays and their difference, per partition and per padded user;
- ``warehouse``: a partition's recorded jobs and capacity from ClickHouse.
"""
