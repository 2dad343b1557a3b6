"""The admin's password when none is configured: generated once, kept beside the data
directory (``<data>.password``, mode 0600: outside what the engine process may read), and read
from there by the demo, the sink and ``gpugap sql`` (ClickHouseSettings finds the local
default's), as Jupyter does with its token. No endpoint answers without a password unless
told to (``--insecure-no-password``)."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from gpugap.schemas.errors import ConfigError


def password_file(data: Path) -> Path:
    """Where the generated password of the endpoint serving ``data`` is kept."""
    return data.parent / f"{data.name}.password"


def ensure(data: Path) -> tuple[str, bool]:
    """The generated password for ``data`` (and whether it was made just now): made with a
    random token the first time, read back every time after."""
    path = password_file(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return read(path), False
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token, True


def read(path: Path) -> str:
    """A password file's content, refused if anyone but its owner may read or change it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"cannot read the password file {path}: {exc.strerror}") from None
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise ConfigError(
                f"the password file {path} must be a regular file only its owner may read "
                f"(mode is {stat.filemode(info.st_mode)}): chmod 600 {path}"
            )
        text = f.read().strip()
    if not text:
        raise ConfigError(f"the password file {path} is empty: delete it to have one generated")
    return text
