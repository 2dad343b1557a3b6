"""Which pod a process belongs to, from its cgroup (``<proc_root>/<pid>/cgroup``).

The kubelet puts every container in a cgroup under its pod's, named by the pod's UID:

- cgroup v1 / cgroupfs driver: ``.../kubepods/burstable/pod<uid>/<container id>`` (and
  ``kubepods/pod<uid>`` for Guaranteed pods);
- systemd driver (v1 or v2): ``.../kubepods-burstable-pod<uid with _ for ->.slice/...``.

Static pods have a 32-hex-digit UID (a hash of their manifest), without dashes. A process of
no pod (on the host, in a Slurm job, a container outside Kubernetes) has no such component.
"""

from __future__ import annotations

import re
from pathlib import Path

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD = re.compile(rf"kubepods[^\n]*?[/-]pod({_UID})(?:\.slice)?(?:/|$)")
#: a cgroup file is a few lines; a larger one is not what we expect
_MAX_BYTES = 64 * 1024


def pod_uid_of_cgroup(text: str) -> str | None:
    """The pod UID in the text of a ``/proc/<pid>/cgroup`` file, or None."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        found = _POD.search(path)
        if found:
            return found.group(1).replace("_", "-")
    return None


def pod_uid_of_pid(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The pod UID of a running process; None for a process of no pod, or one that is gone."""
    try:
        with open(proc_root / str(pid) / "cgroup", encoding="utf-8", errors="replace") as fh:
            text = fh.read(_MAX_BYTES)
    except OSError:  # gone meanwhile, or not visible from here (no hostPID)
        return None
    return pod_uid_of_cgroup(text)
