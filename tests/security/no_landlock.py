"""Run a command as on a kernel without Landlock: a seccomp filter (inherited by every child)
answers the three Landlock calls with ENOSYS, as an old kernel does, or a container runtime
whose seccomp profile predates them.

    python -m tests.security.no_landlock COMMAND [ARG...]
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

_LANDLOCK_CALLS = (444, 445, 446)  # landlock_create_ruleset, _add_rule, _restrict_self
_SECCOMP = {"x86_64": 317, "aarch64": 277}


def main() -> None:
    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    program = [op(0x20, 0)]  # load the syscall number
    for number in _LANDLOCK_CALLS:
        program += [op(0x15, number, 0, 1), op(0x06, 0x00050000 | errno.ENOSYS)]
    program.append(op(0x06, 0x7FFF0000))  # allow the rest
    code = ctypes.create_string_buffer(b"".join(program))
    fprog = ctypes.create_string_buffer(
        struct.pack("HxxxxxxP", len(program), ctypes.addressof(code))
    )
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    if libc.syscall(_SECCOMP[platform.machine()], 1, 0, fprog) != 0:
        raise OSError(ctypes.get_errno(), "seccomp")
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
