"""Slurm jobs per GPU from a job-mapping directory in dcgm-exporter's hpc-job-mapping format.

A Slurm prolog writes one file per GPU the job got, named after the GPU's index on the node,
holding the job id (one per line when jobs share a GPU); the epilog removes it. The same
directory can then serve dcgm-exporter (``--hpc-job-mapping-dir``) and this agent.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def read_job_map(directory: Path) -> dict[int, str]:
    """GPU index -> Slurm job id. Files that are not a GPU index, or are empty, are skipped;
    a GPU shared by several jobs is attributed to the first job listed."""
    out: dict[int, str] = {}
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return out  # no job on this node has written one yet
    except OSError as exc:
        log.warning("job map: cannot read %s: %s", directory, exc.strerror)
        return out
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(entry.path, encoding="utf-8", errors="replace") as fh:
                jobs = [line.strip() for line in fh if line.strip()]
        except (FileNotFoundError, IsADirectoryError):  # the epilog removed it meanwhile
            continue
        except OSError as exc:
            log.warning("job map: cannot read %s: %s", entry.path, exc.strerror)
            continue
        jobs = [j for j in jobs if "/" not in j and " " not in j]
        if jobs:
            if len(jobs) > 1:
                log.debug("job map: GPU %s is shared by jobs %s", entry.name, jobs)
            out[int(entry.name)] = jobs[0]
    return out
