"""Which pod a process belongs to, from its cgroup: ``/proc/<pid>/cgroup``.

The kubelet puts every container of a pod in a cgroup under the pod's own, named by the pod's
UID, in one of two spellings:

- cgroupfs driver (cgroup v1 or v2): ``.../kubepods/burstable/pod<uid>/<container id>``
  (guaranteed pods sit directly under ``kubepods/``);
- systemd driver: ``.../kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<id>.scope``.

Both are read the way dcgm-exporter's pidmapper reads them (``pod([a-f0-9_-]+)``, ``_`` back to
``-``, a UID of at least 32 characters), but only from path parts that start with ``pod`` or
``kubepods-...-pod``, so a container id that happens to hold the letters ``pod`` is not taken.

Shared by the node agents (NVML, amdsmi): the process lists of every vendor name PIDs. The
PIDs are the host's: the agent needs the host's PID namespace (``hostPID: true``) or the host's
``/proc`` mounted somewhere (``proc_root``), else no process maps to a pod.
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_PROC_ROOT = Path("/proc")
#: a cgroup file is a few lines; anything longer is not one (bounded read)
MAX_CGROUP_BYTES = 64 << 10
_MIN_UID_CHARS = 32  # pidmapper's rule: shorter matches are not a UID
#: one path part naming a pod: 'pod<uid>' (cgroupfs) or 'kubepods-<qos>-pod<uid>.slice'
_POD_PART = re.compile(r"^(?:kubepods(?:-[a-z]+)?-)?pod([0-9a-f_-]+?)(?:\.slice)?$")


def pod_uid_of_cgroup(text: str) -> str | None:
    """The pod UID in the text of a ``/proc/<pid>/cgroup`` file, or None (a process of no pod).

    Every line (``hierarchy-id:controllers:path``) is looked at; the first pod UID found wins
    (all hierarchies of one process name the same pod)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        for part in path.split("/"):
            found = _POD_PART.match(part)
            if found and len(found.group(1)) >= _MIN_UID_CHARS:
                return found.group(1).replace("_", "-")
    return None


def pid_visible(pid: int, proc_root: Path = DEFAULT_PROC_ROOT) -> bool:
    """Whether this agent sees the process: a PID from the driver that is missing here is
    one that has exited, or one of the host's while the agent has a PID namespace of its own."""
    return (proc_root / str(int(pid))).is_dir()


def pod_uid_of_pid(pid: int, proc_root: Path = DEFAULT_PROC_ROOT) -> str | None:
    """The pod UID of a running process, or None: a process of no pod, one that has exited,
    or one this agent cannot see (another PID namespace)."""
    try:
        with open(proc_root / str(int(pid)) / "cgroup", "rb") as f:
            raw = f.read(MAX_CGROUP_BYTES)
    except OSError:
        return None
    return pod_uid_of_cgroup(raw.decode("utf-8", "replace"))
