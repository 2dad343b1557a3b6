"""The sign-on tests' two Go programs, built once from the Go module proxy into
``~/.cache/gpugap/<tool>-<version>/<tool>`` (or under ``GPUGAP_SERVICES_CACHE_DIR``): Ory Hydra,
the OpenID Connect provider (tests/harness/hydra.py), and oauth2-proxy, the reverse proxy that
signs people in against it (tests/harness/oauth2_proxy.py).

oauth2-proxy's module has no ``replace`` lines, so ``go install ...@v7.15.6`` builds it. Hydra's
has two, and ``go install`` refuses a module with any: it is built as a tool of a scratch module
(``go get -tool``) that repeats the ``replace`` its code needs (Ory's fork of pop), with the
``sqlite`` build tag and cgo, without which ``DSN=memory`` is refused.

Each build runs under a lock file, so two sessions never build one tool at once, and the binary
is renamed into place when complete, so a half-built one is never taken for a finished one. A
build that fails raises ``SignonBuildError`` with the output's tail: the fixtures that need the
tool fail rather than skip. Only the standard library is imported here, so ``.ci/run`` can build
both ahead of the tests, before the virtualenv exists: ``python3 -m tests.harness.signon_build``.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.harness.go_build import find_go, run

HYDRA_VERSION = "2.3.0"
HYDRA_MODULE = "github.com/ory/hydra/v2"
# Hydra's own go.mod replaces pop with Ory's fork; a dependency's replace lines are ignored, so
# the scratch module repeats it (upstream pop lacks what Hydra calls). Its other replace points
# at a folder the module's zip leaves out; the published client it names builds as well.
HYDRA_REPLACES = (
    "github.com/gobuffalo/pop/v6=github.com/ory/pop/v6@v6.2.1-0.20241121111754-e5dfc0f3344b",
)
# sqlite: the in-memory database (DSN=memory); without the load-extension symbols, no dlopen
HYDRA_TAGS = "sqlite,sqlite_omit_load_extension"

OAUTH2_PROXY_VERSION = "7.15.6"
OAUTH2_PROXY_MODULE = "github.com/oauth2-proxy/oauth2-proxy/v7"


class SignonBuildError(RuntimeError):
    pass


def cache_root() -> Path:
    """ServicesSettings().cache_dir, read without pydantic (this module runs before the venv)."""
    given = os.environ.get("GPUGAP_SERVICES_CACHE_DIR")
    return Path(given).expanduser() if given else Path.home() / ".cache" / "gpugap"


def hydra_path(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / f"hydra-{HYDRA_VERSION}" / "hydra"


def oauth2_proxy_path(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / f"oauth2-proxy-{OAUTH2_PROXY_VERSION}" / "oauth2-proxy"


def _go_env() -> dict[str, str]:
    env = {**os.environ, "GOFLAGS": "-buildvcs=false"}
    env.setdefault("GOTOOLCHAIN", "auto")
    return env


def _build_hydra(go: str, scratch: Path, out: Path) -> None:
    env = {**_go_env(), "CGO_ENABLED": "1"}  # go-sqlite3 is C
    mod = scratch / "mod"
    mod.mkdir()
    run([go, "-C", str(mod), "mod", "init", "gpugap.test/hydra-build"], SignonBuildError, env=env)
    for replace in HYDRA_REPLACES:
        run([go, "-C", str(mod), "mod", "edit", f"-replace={replace}"], SignonBuildError, env=env)
    tool = f"{HYDRA_MODULE}@v{HYDRA_VERSION}"
    run([go, "-C", str(mod), "get", "-tool", tool], SignonBuildError, timeout=900, env=env)
    cmd = [go, "-C", str(mod), "build", "-tags", HYDRA_TAGS, "-trimpath", "-ldflags=-s -w"]
    run([*cmd, "-o", str(out), HYDRA_MODULE], SignonBuildError, env=env)


def _build_oauth2_proxy(go: str, scratch: Path, out: Path) -> None:
    env = {**_go_env(), "GOBIN": str(scratch), "CGO_ENABLED": "0"}
    package = f"{OAUTH2_PROXY_MODULE}@v{OAUTH2_PROXY_VERSION}"
    run([go, "install", "-trimpath", "-ldflags=-s -w", package], SignonBuildError, env=env)
    (scratch / "oauth2-proxy").rename(out)


def _ensure(exe: Path, what: str, build: Callable[[str, Path, Path], None]) -> Path:
    if exe.exists():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    with open(exe.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session building: wait for it
        if exe.exists():
            return exe
        go = find_go(SignonBuildError, what)
        print(
            f"building {what} from the Go module proxy into {exe} (once, minutes on 2 cores)...",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=exe.parent, prefix=".build-") as tmp:
            built = Path(tmp, "out", exe.name)
            built.parent.mkdir()
            build(go, Path(tmp), built)
            built.rename(exe)  # atomic: a half-built binary is never taken for a whole one
        print(f"built {what} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return exe


def ensure_hydra(cache: Path | None = None) -> Path:
    """The Ory Hydra binary: the cached one, else built now (once, under a lock)."""
    return _ensure(hydra_path(cache), f"Ory Hydra {HYDRA_VERSION}", _build_hydra)


def ensure_oauth2_proxy(cache: Path | None = None) -> Path:
    """The oauth2-proxy binary: the cached one, else built now (once, under a lock)."""
    return _ensure(
        oauth2_proxy_path(cache), f"oauth2-proxy {OAUTH2_PROXY_VERSION}", _build_oauth2_proxy
    )


def main() -> int:
    failed = 0
    for ensure in (ensure_hydra, ensure_oauth2_proxy):
        try:
            print(ensure(), flush=True)
        except (SignonBuildError, OSError, subprocess.TimeoutExpired) as error:
            print(f"{ensure.__name__}: {error}", file=sys.stderr, flush=True)
            failed = 1
    return failed


if __name__ == "__main__":  # python3 -m tests.harness.signon_build: build (or find) both
    sys.exit(main())
