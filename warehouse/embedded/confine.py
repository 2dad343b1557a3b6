"""The operating system as the engine's boundary: after ``confine()`` the calling process can
read and write beneath its data directory, read its own libraries and a few files describing
the machine, and nothing else of the host, whatever SQL reaches the engine it runs.

- **Landlock** (unprivileged, stackable, works inside containers): every file access right is
  handled, and granted only beneath the listed paths (ABI 2, Linux 5.19, for renames across
  directories, which the engine's own storage does; ABI 4 adds TCP bind/connect, ABI 6 keeps
  signals and abstract Unix sockets inside the sandbox).
- **seccomp**: no new socket of any family (no network at all, on every kernel, whatever
  Landlock's ABI), no program started (execve), no other process's memory (ptrace,
  process_vm_*, pidfd_getfd), no io_uring (its operations would pass the socket filter), no new
  namespaces, mounts, modules, BPF programs or kernel keys.
- **Capabilities** are dropped, so an engine started as root is an ordinary user towards the
  files its rules allow.

Namespaces were the other choice; they need privileges or unprivileged user namespaces, which
many hosts and most containers refuse. Landlock and seccomp need neither. Both apply to the
calling thread and the threads it starts later, so this runs first, before the engine (whose
import alone starts a dozen threads) is loaded.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpugap.schemas.errors import ConfigError

# --- Landlock (include/uapi/linux/landlock.h) --------------------------------------------------

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
# the file access rights each ABI knows (all of them are handled: what is not granted is denied)
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_FS_LATEST = (1 << 16) - 1  # ABI 5 and later: IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
# rights that make sense on a file (not a directory) beneath a rule
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

READ = READ_FILE | READ_DIR
# the data directory: everything but running a program, making devices, sockets or FIFOs
WRITE = (
    READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SYM | REFER
    | TRUNCATE
)  # fmt: skip
MINIMUM_ABI = 2  # renames across directories (REFER): the engine moves parts and tables


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


# --- seccomp (include/uapi/linux/seccomp.h, filter.h) -----------------------------------------

_PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _JSET_K, _JGE_K, _RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low half)
_CLONE_NEW_NAMESPACES = (
    0x7E020080  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
)


@dataclass(frozen=True)
class _Arch:
    audit: int
    seccomp: int
    capset: int
    x32_bit: bool  # syscall numbers with bit 30 set are the x32 ABI: refused
    clone: int
    clone3: int
    no_socket: tuple[int, ...]  # socket, socketpair
    denied: tuple[int, ...]  # EPERM


# ptrace, process_vm_readv/writev, pidfd_getfd, execve, execveat, io_uring_setup/enter/register,
# unshare, setns, mount, umount2, pivot_root, chroot, fsopen, fsconfig, fsmount, fspick,
# open_tree, move_mount, mount_setattr, bpf, perf_event_open, userfaultfd, init_module,
# finit_module, delete_module, kexec_load, kexec_file_load, reboot, keyctl, add_key, request_key
_ARCHES = {
    "x86_64": _Arch(
        0xC000003E, 317, 126, True, 56, 435, (41, 53),
        (101, 310, 311, 438, 59, 322, 425, 426, 427, 272, 308, 165, 166, 155, 161, 430, 431,
         432, 433, 428, 429, 442, 321, 298, 323, 175, 313, 176, 246, 320, 169, 250, 248, 249),
    ),
    "aarch64": _Arch(
        0xC00000B7, 277, 91, False, 220, 435, (198, 199),
        (117, 270, 271, 438, 221, 281, 425, 426, 427, 97, 268, 40, 39, 41, 51, 430, 431, 432,
         433, 428, 429, 442, 280, 241, 282, 105, 273, 106, 104, 294, 142, 219, 217, 218),
    ),
}  # fmt: skip


class ConfinementError(ConfigError):
    """The engine cannot be confined as required on this kernel."""


@dataclass
class Report:
    """What the kernel let this process do to itself."""

    landlock_abi: int = 0
    files: bool = False  # Landlock on files
    tcp: bool = False  # Landlock on TCP bind/connect (ABI 4)
    scopes: bool = False  # signals, abstract Unix sockets (ABI 6)
    seccomp: bool = False
    capabilities: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.files and self.seccomp

    def describe(self) -> str:
        parts = [
            f"Landlock ABI {self.landlock_abi}" if self.landlock_abi else "no Landlock",
            "files" if self.files else "files NOT confined",
            "no network (seccomp)" if self.seccomp else "network and programs NOT blocked",
        ]
        return ", ".join(parts)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args: object) -> int:
    result = int(_libc.syscall(number, *args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (older kernel, not enabled, or
    refused by a seccomp profile around us)."""
    try:
        return _syscall(_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    except OSError:
        return 0


def confine(writable: Iterable[Path], readable: Iterable[Path], *, required: bool) -> Report:
    """Confine this process (and the threads it starts from now on) to ``writable`` (read and
    write beneath) and ``readable`` (read beneath; a file or a directory). Missing paths are
    left out. ``required``: raise ConfinementError instead of running half-confined."""
    report = Report(landlock_abi=landlock_abi())
    # no_new_privs first: Landlock and seccomp both need it without CAP_SYS_ADMIN, and no
    # setuid program could give back what is taken here
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        report.problems.append("prctl(PR_SET_NO_NEW_PRIVS) failed")
    if report.landlock_abi >= MINIMUM_ABI:
        try:
            _landlock(report, list(writable), list(readable))
            report.files = True
        except OSError as exc:
            report.problems.append(f"Landlock refused: {exc}")
    elif report.landlock_abi:
        report.problems.append(
            f"Landlock ABI {report.landlock_abi} cannot confine the engine's renames across "
            f"directories (ABI {MINIMUM_ABI}, Linux 5.19, is needed)"
        )
    else:
        report.problems.append("this kernel has no Landlock (Linux 5.19 or later, with "
                               "landlock among the LSMs, is needed)")  # fmt: skip
    try:
        _seccomp()
        report.seccomp = True
    except (OSError, KeyError) as exc:
        report.problems.append(f"seccomp refused: {exc}")
    report.capabilities = _drop_capabilities()
    if required and not report.complete:
        raise ConfinementError(
            "the ClickHouse engine cannot be confined on this machine: "
            + "; ".join(report.problems)
            + ". Run it on a kernel with Landlock (see "
            "docs/security.md#confinement-the-operating-system-is-the-boundary), or set "
            "GPUGAP_CLICKHOUSE_SERVE_CONFINE=best-effort (what the kernel allows) or =off"
        )
    return report


def _landlock(report: Report, writable: list[Path], readable: list[Path]) -> None:
    abi = report.landlock_abi
    handled_fs = _FS_BY_ABI.get(abi, _FS_LATEST)
    attr = _RulesetAttr(handled_fs, 0, 0)
    if abi >= 4:  # no TCP bind or connect at all (seccomp also refuses every socket)
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
        report.tcp = True
    if abi >= 6:  # no signal to, and no abstract socket of, a process outside the sandbox
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
        report.scopes = True
    ruleset = _syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    try:
        for path in writable:
            _allow(ruleset, path, WRITE & handled_fs)
        for path in readable:
            _allow(ruleset, path, READ & handled_fs)
        for path in (Path("/dev/null"), Path("/dev/zero")):
            _allow(ruleset, path, (READ_FILE | WRITE_FILE | TRUNCATE) & handled_fs)
        _syscall(_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)


def _allow(ruleset: int, path: Path, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:  # not on this machine (a library directory some systems lack)
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        rule = _PathBeneath(rights, fd)
        _syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0)
    finally:
        os.close(fd)


def _seccomp() -> None:
    arch = _ARCHES[platform.machine()]
    program = _filter(arch)
    buffer = ctypes.create_string_buffer(b"".join(program))
    # struct sock_fprog: unsigned short len, (padding), struct sock_filter *filter
    fprog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(buffer))
    fprog_buffer = ctypes.create_string_buffer(fprog)
    _syscall(arch.seccomp, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, fprog_buffer)


def _filter(arch: _Arch) -> list[bytes]:
    """The BPF program: each refused call is a compare followed by its return, so every jump is
    at most a few instructions (BPF's jumps are 8-bit)."""

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    def refuse(err: int) -> bytes:
        return op(_RET_K, _RET_ERRNO | err)

    prog = [op(_LD_W_ABS, _ARCH), op(_JEQ_K, arch.audit, 1, 0), refuse(errno.EPERM)]
    prog.append(op(_LD_W_ABS, _NR))
    if arch.x32_bit:
        prog += [op(_JGE_K, 0x40000000, 0, 1), refuse(errno.EPERM)]
    for number in arch.no_socket:
        prog += [op(_JEQ_K, number, 0, 1), refuse(errno.EACCES)]
    for number in arch.denied:
        prog += [op(_JEQ_K, number, 0, 1), refuse(errno.EPERM)]
    # clone3 passes its flags in a struct BPF cannot read: ENOSYS makes glibc use clone,
    # whose flags it can
    prog += [op(_JEQ_K, arch.clone3, 0, 1), refuse(errno.ENOSYS)]
    prog += [
        op(_JEQ_K, arch.clone, 0, 3),
        op(_LD_W_ABS, _ARG0),
        op(_JSET_K, _CLONE_NEW_NAMESPACES, 0, 1),
        refuse(errno.EPERM),
        op(_RET_K, _RET_ALLOW),
    ]
    return prog


def _drop_capabilities() -> bool:
    """Effective, permitted and inheritable sets emptied (and the ambient set)."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return False
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two empty {effective, permitted, inheritable}
    try:
        _syscall(
            arch.capset, ctypes.create_string_buffer(header), ctypes.create_string_buffer(data)
        )
    except OSError:
        return False
    return True
