"""What the jobcomp/kafka consumer remembers between records and restarts: which run each SLUID
is, the start event of each run still running (its end record does not say which GPUs), and
the event ids it already published (slurmctld re-sends what it purged at shutdown).

Why runs need memory: a jobcomp record names its run by a SLUID, the hook and the poller by
Slurm's restart count (``12#1``), and no record carries the count. slurmctld knows both for the
job's current run (``scontrol show job``: ``sluid``, ``restart_cnt``): that is exact and is
asked first. Where it cannot tell (the job purged from slurmctld, or the record is of an earlier
run), SLUIDs are in time order: a run is the number of this job's known runs before it. Records
of one job come in run order unless a broker outage reorders them, and then slurmctld, still
holding the job, has named the current run.

A JSON file written atomically after the records it reflects are flushed to Kafka, so a crash
re-sends (same event ids, deduplicated downstream), never skips.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

#: how long a finished job's runs and published ids are kept (a purge re-send comes at the
#: next slurmctld start; a week covers a long outage)
KEEP_S = 7 * 86400
#: running runs remembered at most (a site's running jobs; beyond it the oldest go first and
#: their ends are counted, not indexed)
MAX_OPEN = 200_000


class RunLedger:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        #: raw job id -> {SLUID: run}
        self.runs: dict[str, dict[str, int]] = {}
        #: "<job id>#<run>" -> its start event (dict), while it runs
        self.open: dict[str, dict[str, Any]] = {}
        #: published event id -> when
        self.emitted: dict[str, float] = {}
        #: raw job id -> last seen (for pruning ``runs``)
        self.seen: dict[str, float] = {}
        if path is not None and path.exists():
            data = json.loads(path.read_text())
            self.runs = data.get("runs", {})
            self.open = data.get("open", {})
            self.emitted = data.get("emitted", {})
            self.seen = data.get("seen", {})

    def known(self, raw_id: str, sluid: str | None) -> int | None:
        """The run of a SLUID seen before, else None."""
        return self.runs.get(raw_id, {}).get(sluid) if sluid is not None else None

    def run_of(self, raw_id: str, sluid: str | None, current: tuple[str, int] | None) -> int:
        """The run of this job's record with ``sluid``; ``current``: slurmctld's (SLUID,
        restart count) of the job now, if it knows the job."""
        self.seen[raw_id] = time.time()
        if sluid is None:  # before 26.05: no SLUID, the restart count of slurmctld or 0
            return current[1] if current is not None else 0
        known = self.runs.setdefault(raw_id, {})
        if sluid in known:
            return known[sluid]
        if current is not None and current[0] == sluid:
            run = current[1]
        else:
            run = sum(1 for other in known if other < sluid)
            if current is not None and current[0] > sluid:
                # an earlier run than slurmctld's current one: at most one less than it
                run = min(run, max(0, current[1] - 1))
        known[sluid] = run
        return run

    def save(self) -> None:
        cutoff = time.time() - KEEP_S
        self.emitted = {k: t for k, t in self.emitted.items() if t >= cutoff}
        stale = [job for job, t in self.seen.items() if t < cutoff]
        for job in stale:
            self.seen.pop(job, None)
            self.runs.pop(job, None)
        if len(self.open) > MAX_OPEN:
            oldest = sorted(self.open, key=lambda k: self.open[k].get("start_time", ""))
            for key in oldest[: len(self.open) - MAX_OPEN]:
                del self.open[key]
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        state = {"runs": self.runs, "open": self.open, "emitted": self.emitted, "seen": self.seen}
        tmp.write_text(json.dumps(state))
        tmp.replace(self.path)
