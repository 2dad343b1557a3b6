"""The hook's local spool: events Kafka did not take, one file each, shipped later.

A file is one JSON envelope, the JSONL publisher's shape (``{"topic", "key", "value",
"timestamp_ms"}``; the topic without the deployment's prefix). Files are written to a temporary
name and renamed, so a reader never sees half a file. A sender claims a file by renaming it to
``<name>.<pid>.sending`` (rename is atomic: two drainers never ship the same file), deletes it
once the broker acknowledged, renames it back otherwise; claims of dead processes are undone.
The directory also keeps each running job's start event (``jobs/<raw id>.json``): the end hook
takes the GPU indices from it, because nothing Slurm hands the end hooks says which GPUs it was.
Job names, users and accounts are in there: directories this module creates are 0700 and its
files 0600, whatever the umask slurmctld runs the hook with (an existing directory is left as
the administrator made it).
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from producers.slurm.event import encode

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (hook start-up)
if TYPE_CHECKING:
    from typing import Any

# Paths are plain strings (os.path): pathlib and what it imports cost the hook ~10 ms.


def events_dir(root: str) -> str:
    return os.path.join(root, "events")


def jobs_dir(root: str) -> str:
    return os.path.join(root, "jobs")


def private_dir(path: str) -> None:
    """``mkdir -p``, each directory it creates 0700 (os.makedirs leaves the parents it creates
    to the umask)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path.rstrip(os.sep))
    if parent and parent != path:
        private_dir(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return  # another hook made it meanwhile
    os.chmod(path, 0o700)  # exactly 0700, whatever the umask


def open_private(path: str, flags: int) -> int:
    """os.open, a file it creates 0600."""
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    if os.fstat(fd).st_mode & 0o077:
        os.fchmod(fd, 0o600)  # made by an older version, or under an odd umask
    return fd


def _write_atomic(path: str, data: bytes, sync: bool = True) -> None:
    folder, name = os.path.split(path)
    private_dir(folder)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
        fh.write(data)
        if sync:
            os.fsync(fh.fileno())  # a spooled event must survive a crash of the host
    os.replace(tmp, path)


def write_small(path: str, text: str) -> None:
    """A small state file (no fsync: losing it costs one question asked again)."""
    _write_atomic(path, text.encode(), sync=False)


def envelope(topic: str, key: str, value: dict[str, Any], timestamp_ms: int) -> dict[str, Any]:
    return {"topic": topic, "key": key, "value": value, "timestamp_ms": timestamp_ms}


def _safe(name: str) -> str:
    """An event id as a file name (urllib.parse.quote would cost the hook ~5 ms of imports)."""
    return "".join(c if c.isalnum() or c in "-_+.[]" else "~" for c in name)


def spool(root: str, env: dict[str, Any], name: str) -> str:
    """Keep one envelope; the same ``name`` (an event id) overwrites: spooling twice is harmless."""
    path = os.path.join(events_dir(root), f"{env['timestamp_ms']:013d}-{_safe(name)}.json")
    _write_atomic(path, encode(env))
    return path


def pending(root: str) -> list[str]:
    """Spooled envelopes, oldest first (names start with the event time)."""
    d = events_dir(root)
    try:
        names = sorted(e.name for e in os.scandir(d) if e.name.endswith(".json"))
    except FileNotFoundError:
        return []
    return [os.path.join(d, n) for n in names if not n.startswith(".")]


def claim(path: str) -> str | None:
    claimed = f"{path}.{os.getpid()}.sending"
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None  # another sender took it
    return claimed


def unclaim(claimed: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.rename(claimed, claimed.rsplit(".", 2)[0])


def release(claimed: str) -> None:
    """The broker acknowledged it: gone."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(claimed)


def recover(root: str) -> int:
    """Give back claims whose process is gone (a sender killed mid-way). Returns how many."""
    n = 0
    with contextlib.suppress(FileNotFoundError):
        for e in os.scandir(events_dir(root)):
            if not e.name.endswith(".sending"):
                continue
            pid = int(e.name.rsplit(".", 2)[1])
            if not _alive(pid):
                unclaim(e.path)
                n += 1
    return n


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read(path: str) -> dict[str, Any]:
    with open(path, "rb") as fh:
        data: dict[str, Any] = json.loads(fh.read())
    return data


def save_start(root: str, raw_id: str, event: dict[str, Any]) -> None:
    # no fsync: if it is lost, the end event only lacks GPU indices (the poller has them)
    _write_atomic(os.path.join(jobs_dir(root), f"{raw_id}.json"), encode(event), sync=False)


def load_start(root: str, raw_id: str) -> dict[str, Any] | None:
    try:
        return read(os.path.join(jobs_dir(root), f"{raw_id}.json"))
    except (FileNotFoundError, ValueError):
        return None


def forget_start(root: str, raw_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(jobs_dir(root), f"{raw_id}.json"))


def prune_starts(root: str, max_age_s: float) -> int:
    """Start records of jobs whose end never came (jobcomp not configured, lost): drop old ones."""
    n, cutoff = 0, time.time() - max_age_s
    with contextlib.suppress(FileNotFoundError):
        for e in os.scandir(jobs_dir(root)):
            if e.name.endswith(".json") and e.stat().st_mtime < cutoff:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
                    n += 1
    return n
