"""The Slurm producer: the hook slurmctld runs per job (``gpugap slurm-hook``), its spool and
drain, and the poller (``gpugap produce slurm``).

This package's ``__init__`` and the hook's modules (``hook_command``, ``hook``, ``event``,
``fields``, ``scontrol``, ``show``, ``spool``, ``wire``, ``parse``, ``hostlist``) import the
standard library only: slurmctld waits for the hook on every job start, so nothing heavy
(pydantic, aiokafka) may be imported there."""
