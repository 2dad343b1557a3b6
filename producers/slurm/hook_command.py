"""``gpugap slurm-hook``: the one command slurmctld runs as PrologSlurmctld, EpilogSlurmctld and
jobcomp/script (the slurm.conf lines: deploy/slurm/slurm.conf.gpugap; README "Slurm producer").

- PrologSlurmctld: the job is starting. The environment has the job's user, account,
  partition, nodes and name, but no GPUs, no time limit and no start time, so the hook asks
  ``scontrol --json -d show job`` (Slurm 23.02+) or ``scontrol -o show job -d`` (state
  CONFIGURING, GRES with indices), which must agree with the environment, and sends a
  ``start`` event. It keeps that event in the spool directory: nothing Slurm gives the end
  hooks says which GPUs the job had.
- jobcomp/script: the job ended (also jobs that never started). Its environment has the
  state, exit code and times; the GPUs come from the kept start event. Sends an ``end`` event.
- EpilogSlurmctld: a no-op unless ``GPUGAP_SLURM_END_HOOK=epilog`` (for sites whose jobcomp
  plugin is taken): its environment has no job state, so the state is inferred (see
  ``_epilog_state``) and jobcomp/script is the better source.

Text the job's owner wrote (name, comment, paths) is data: scontrol's text is read by its
layout, never split on ``Key=`` (producers/slurm/scontrol.py); a name is sent as UTF-8
(bytes that are not become U+FFFD) and cut at 256 characters (``event.NAME_MAX``).

It never fails or holds up a job: everything runs under one deadline
(``GPUGAP_SLURM_HOOK_TIMEOUT_S``), it always exits 0, and an event Kafka did not acknowledge
in time is spooled to disk (a 0700 directory, 0600 files) for ``gpugap slurm-hook drain``.
A spool directory (or its events/, jobs/) that is a symbolic link, another user's, or
writable by its group or others is refused: one line on stderr saying which path, its owner
and mode and the chown/chmod that fixes it, nothing else done, exit 0 (producers/slurm/spool.py).
A variable it cannot use is one line in <spool>/hook.log, and the event is spooled. After a
successful send it also ships a few spooled events, so a backlog empties as soon as jobs run
again.

Only the standard library is imported here: slurmctld waits for the prolog on every job
start, and pydantic or aiokafka alone would cost several times the whole hook.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence

# The work (parsers, Kafka client, spool) is imported only for the contexts that report
# something: the no-op contexts exit after the interpreter's own start-up.


def started_at() -> float:
    """When this process started, on the time.monotonic() clock: the deadline counts the
    interpreter's start-up too, since slurmctld waits for all of it."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - min(max(age, 0.0), 5.0)


def run(env: Mapping[str, str], t0: float | None = None) -> str:
    """One hook invocation; returns what happened (for logs and tests). Never raises, whatever
    the environment holds: a value it cannot use is logged in one line, and the event is
    spooled (not sent) for `gpugap slurm-hook drain`, which checks the same variables."""
    context = env.get("SLURM_SCRIPT_CONTEXT") or ("jobcomp" if "JOBSTATE" in env else "")
    end_hook = env.get("GPUGAP_SLURM_END_HOOK") or "jobcomp"
    if context not in ("prolog_slurmctld", "jobcomp") and not (
        context == "epilog_slurmctld" and end_hook == "epilog"
    ):
        return "ignored"  # node prolog/epilog, or the epilog while jobcomp reports ends
    cfg = None
    try:
        from gpugap.producers.slurm.hook import HookConfig, deliver, log, on_end, on_prolog, spool

        cfg = HookConfig(env)
        try:
            spool.check(cfg.spool_dir)
        except spool.UnsafeSpool as exc:  # another user could plant links or events there
            sys.stderr.write(
                f"gpugap slurm-hook[{os.getpid()}]: {context}: {exc}; this hook reports "
                "nothing until then (the poller still reports the job)\n"
            )
            return "refused"
        deadline = (t0 if t0 is not None else time.monotonic()) + cfg.timeout_s
        if cfg.problems:
            log(
                cfg,
                f"{context}: {'; '.join(cfg.problems)}: the event is spooled, not sent; fix the "
                "variable where slurmctld runs the hook, then `gpugap slurm-hook drain` ships it",
            )
        raw = None
        if context == "prolog_slurmctld":
            envelopes = on_prolog(cfg, env, deadline)
        else:
            envelopes, raw = on_end(cfg, env, epilog=context == "epilog_slurmctld")
        outcome = deliver(cfg, envelopes, deadline, send=not cfg.problems)
        if raw is not None:
            spool.forget_start(cfg.spool_dir, raw)
        return outcome
    except Exception as exc:  # never fail the job: a bug here must not drain the cluster
        msg = f"{context}: {type(exc).__name__}: {exc}"
        if cfg is not None:
            log(cfg, msg)
        else:  # not even the configuration: stderr is all there is
            sys.stderr.write(f"gpugap slurm-hook[{os.getpid()}]: {msg}\n")
        return "error"


def main(argv: Sequence[str] = ()) -> int:
    if argv and argv[0] == "drain":
        from gpugap.producers.slurm.drain import main as drain_main

        return drain_main(list(argv[1:]))
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    run(os.environ, started_at())  # never raises: the hook always exits 0
    return 0


if __name__ == "__main__":  # ``python -S -m producers.slurm.hook_command``: the fastest start
    sys.exit(main(sys.argv[1:]))
