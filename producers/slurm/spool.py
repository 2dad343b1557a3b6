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

The hook runs as root (or SlurmUser) on what another user may have put there, so nothing here
follows a symbolic link: the spool directory and its ``events/`` and ``jobs/`` must be real
directories (``os.lstat``), owned by the user that writes them and writable by nobody else,
else ``UnsafeSpool`` (one line: which path, its owner and mode, what to run); files are opened
with ``O_NOFOLLOW`` (never a FIFO, device or a second hard link), modes are set with ``fchmod``
on the open file, and a temporary file is always a new one (``O_EXCL``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time

from gpugap.producers.slurm.event import encode

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (hook start-up)
if TYPE_CHECKING:
    from typing import Any

# Paths are plain strings (os.path): pathlib and what it imports cost the hook ~10 ms.


def events_dir(root: str) -> str:
    return os.path.join(root, "events")


def jobs_dir(root: str) -> str:
    return os.path.join(root, "jobs")


#: how a spool directory is opened (to fchmod the one just made) and a spool file
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO never holds up the hook


class UnsafeSpool(OSError):
    """A spool directory or file another user could have made or changed: refused, never
    followed. The message is one line: which path, its owner and mode, and what to run."""


def _shown(path: str) -> str:
    return path if path.isprintable() else repr(path)


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _fix(path: str) -> str:
    """The command that makes ``path`` a private directory of this process's user."""
    try:
        import grp

        group = grp.getgrgid(os.getegid()).gr_name
    except (ImportError, KeyError):
        group = str(os.getegid())
    p = _shown(path)
    q = p if all(c.isalnum() or c in "/._-+" for c in p) else "'" + p.replace("'", "'\\''") + "'"
    return f"chown {_user(os.geteuid())}:{group} {q} && chmod 0700 {q}"


def check_dir(path: str, st: os.stat_result, owners: tuple[int, ...] | None = None) -> None:
    """Raise UnsafeSpool unless ``st`` (``os.lstat(path)``) is a directory, not a symbolic
    link, owned by one of ``owners`` (default: this process's effective user) and writable
    by neither its group nor others (who could put links or forged events in it)."""
    owners = owners or (os.geteuid(),)
    p = _shown(path)
    if stat.S_ISLNK(st.st_mode):
        try:
            to = f" (to {_shown(os.readlink(path))})"
        except OSError:
            to = ""
        raise UnsafeSpool(
            errno.ELOOP,
            f"refusing spool directory {p}: it is a symbolic link{to}, which another user may "
            f"have made; nothing is written through it: remove the link (rm {p}), a 0700 "
            "directory is made in its place",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeSpool(
            errno.ENOTDIR,
            f"refusing spool directory {p}: it is not a directory (mode {st.st_mode:o}); "
            f"move it away, a 0700 directory is made in its place",
        )
    why = []
    if st.st_uid not in owners:
        who = " or ".join(f"uid {u} ({_user(u)})" for u in sorted(set(owners)))
        why.append(f"owned by uid {st.st_uid} ({_user(st.st_uid)}), not {who}")
    writable = st.st_mode & 0o022
    if writable:
        why.append("writable by its group or others")
    if why:
        # a directory only its owner can write: running as that owner is the other fix
        other = "" if writable else f" (or run this as its owner, {_user(st.st_uid)})"
        raise UnsafeSpool(
            errno.EPERM,
            f"refusing spool directory {p} (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}): {' and '.join(why)}, so another user could put "
            f"links or forged events in it; nothing is read or written there until it is "
            f"private: {_fix(path)}{other}",
        )


def check(root: str, owners: tuple[int, ...] | None = None) -> None:
    """The spool directory and its ``events/`` and ``jobs/``, where they exist: each a
    private directory (check_dir), else UnsafeSpool. A missing one is made private later."""
    root = os.path.normpath(root)  # 'spool/' would have lstat follow a link
    for path in (root, events_dir(root), jobs_dir(root)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        check_dir(path, st, owners)


def _make(path: str) -> None:
    """``mkdir -p``, each directory it creates exactly 0700 (os.makedirs leaves the parents
    it creates to the umask); what already exists is left as it is."""
    parent = os.path.dirname(path.rstrip(os.sep))
    if parent and parent != path and not os.path.isdir(parent):
        _make(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return  # another hook made it meanwhile (the caller checks what it is)
    fd = os.open(path, _DIR_FLAGS)  # the directory just made, never a link put in its place
    try:
        os.fchmod(fd, 0o700)  # exactly 0700, whatever the umask
    finally:
        os.close(fd)


def private_dir(path: str) -> None:
    """``mkdir -p`` (what it creates 0700), then ``path`` must be a private directory of
    this user (check_dir: not a symbolic link, not writable by group or others), else
    UnsafeSpool."""
    path = os.path.normpath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        _make(path)
        st = os.lstat(path)
    check_dir(path, st)


def _open(path: str, flags: int) -> int:
    """os.open that never follows a symbolic link nor waits on a FIFO, of a regular file
    with one link (a second hard link could be a file outside the spool), else UnsafeSpool."""
    try:
        fd = os.open(path, flags | _FILE_FLAGS, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            what = "a symbolic link, which another user may have made; it is not followed"
        elif exc.errno == errno.ENXIO:  # a FIFO without a reader, a socket
            what = "not a regular file (a FIFO or a socket); it is not opened"
        else:
            raise
        msg = f"refusing spool file {_shown(path)}: it is {what}: remove it"
        raise UnsafeSpool(exc.errno, msg) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise UnsafeSpool(
                errno.EPERM,
                f"refusing spool file {_shown(path)}: not a regular file with one link (mode "
                f"{st.st_mode:o}, {st.st_nlink} links); remove it",
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: str, flags: int) -> int:
    """os.open of a spool file, one it creates 0600: never through a symbolic link, never a
    FIFO, device or hard link, never a file of another user (UnsafeSpool); the mode is set
    on the open file (fchmod), never on a path."""
    fd = _open(path, flags | os.O_CREAT)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafeSpool(
                errno.EPERM,
                f"refusing spool file {_shown(path)}: owned by uid {st.st_uid} "
                f"({_user(st.st_uid)}), not this user; remove it",
            )
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)  # made by an older version, or under an odd umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_atomic(path: str, data: bytes, sync: bool = True) -> None:
    folder, name = os.path.split(path)
    private_dir(folder)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a crash of a process with this pid: a new file, always
    with open(open_private(tmp, os.O_WRONLY | os.O_EXCL), "wb") as fh:
        fh.write(data)
        if sync:
            os.fsync(fh.fileno())  # a spooled event must survive a crash of the host
    os.replace(tmp, path)  # replaces a link at ``path`` itself, never what it points to


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
        names = sorted(
            e.name
            for e in os.scandir(d)
            if e.name.endswith(".json") and e.is_file(follow_symlinks=False)
        )
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
            try:
                pid = int(e.name.rsplit(".", 2)[1])
            except (ValueError, IndexError):
                continue  # not a claim of ours
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


def read_bytes(path: str) -> bytes:
    """A spool file's bytes: never through a symbolic link, never a FIFO, device or second
    hard link (UnsafeSpool)."""
    with open(_open(path, os.O_RDONLY), "rb") as fh:
        return fh.read()


def read(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(read_bytes(path))
    return data


def save_start(root: str, raw_id: str, event: dict[str, Any]) -> None:
    # no fsync: if it is lost, the end event only lacks GPU indices (the poller has them)
    _write_atomic(os.path.join(jobs_dir(root), f"{raw_id}.json"), encode(event), sync=False)


def load_start(root: str, raw_id: str) -> dict[str, Any] | None:
    try:
        return read(os.path.join(jobs_dir(root), f"{raw_id}.json"))
    except (OSError, ValueError):  # gone, or refused (UnsafeSpool): the end lacks GPU indices
        return None


def forget_start(root: str, raw_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(jobs_dir(root), f"{raw_id}.json"))


def prune_starts(root: str, max_age_s: float) -> int:
    """Start records of jobs whose end never came (jobcomp not configured, lost): drop old ones."""
    n, cutoff = 0, time.time() - max_age_s
    with contextlib.suppress(FileNotFoundError):
        for e in os.scandir(jobs_dir(root)):
            if e.name.endswith(".json") and e.stat(follow_symlinks=False).st_mtime < cutoff:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
                    n += 1
    return n
