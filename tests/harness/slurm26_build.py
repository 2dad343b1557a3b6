"""Slurm 26.05 built once from the vendored release tarball into ``~/.cache/gpugap/slurm-26.05.3``.

The tarball (the unmodified release tag, GPL-2.0) is ``../shared/vendor/slurm-26.05.3.tar.xz``
beside the checkout, or wherever ``GPUGAP_SLURM26_TARBALL`` points; its sha256 is checked.
Debian's build dependencies are installed with apt-get when missing (root only). The build
(../shared/reference/slurm-26.md): ``./configure --with-rdkafka --with-json --with-jwt
--with-yaml`` with libmariadb-dev present, so slurmdbd's MySQL plugin is built in the same pass;
~9 min on 2 cores, under a file lock so concurrent sessions build it once; warm: a stat.

``python -m tests.harness.slurm26_build`` builds it ahead of the tests (``.ci/run`` starts it in
the background while the virtualenv and linters run).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "26.05.3"
SHA256 = "b7c7c7c8d78f7fde485ac7fc811034c5dd1a067d0167dba1a044e731c0374b13"
ROOT = Path(__file__).resolve().parents[2]
BUILD_PACKAGES = (
    "libjson-c-dev",
    "libjwt-dev",
    "librdkafka-dev",
    "libhttp-parser-dev",
    "libyaml-dev",
    "libmunge-dev",
    "libmariadb-dev",
    "munge",
    "mariadb-server",
    "make",
    "gcc",
    "pkg-config",
)
#: what a usable build has: the daemons, the tools, and the plugins the tests configure
PRODUCTS = (
    "sbin/slurmctld",
    "sbin/slurmd",
    "sbin/slurmdbd",
    "sbin/slurmrestd",
    "bin/sbatch",
    "bin/scontrol",
    "bin/sacctmgr",
    "lib/slurm/jobcomp_kafka.so",
    "lib/slurm/metrics_openmetrics.so",
    "lib/slurm/accounting_storage_mysql.so",
    "lib/slurm/rest_auth_jwt.so",
)


class Slurm26Unavailable(RuntimeError):
    """Slurm 26.05 cannot be built here; the message says why and what to do."""


def cache_root() -> Path:
    base = Path(os.environ.get("GPUGAP_CACHE", Path.home() / ".cache" / "gpugap"))
    return base / f"slurm-{VERSION}"


def tarball() -> Path:
    candidates = [
        os.environ.get("GPUGAP_SLURM26_TARBALL"),
        ROOT.parent / "shared" / "vendor" / f"slurm-{VERSION}.tar.xz",
        Path("/work/shared/vendor") / f"slurm-{VERSION}.tar.xz",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise Slurm26Unavailable(
        f"the Slurm {VERSION} source tarball is not at any of "
        f"{[str(c) for c in candidates if c]}: set GPUGAP_SLURM26_TARBALL to it"
    )


def built() -> bool:
    root = cache_root()
    return all((root / product).exists() for product in PRODUCTS)


def build(log: Path | None = None) -> Path:
    """The install prefix of Slurm 26.05, built if not cached."""
    root = cache_root()
    if built():
        return root
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it
        if not built():
            _build(root, log or root / "build.log")
    return root


def _install_packages() -> None:
    missing = [p for p in BUILD_PACKAGES if not _installed(p)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Slurm26Unavailable(f"building Slurm {VERSION} needs {missing} (root + apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open("/tmp/gpugap-slurm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the 22.05 harness installs with apt too
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "-o", "DPkg::Lock::Timeout=600",
             "--no-install-recommends", *missing],
            env=env, check=True, timeout=900, stdout=subprocess.DEVNULL,
        )  # fmt: skip


def _installed(package: str) -> bool:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() == "install ok installed"


def _build(prefix: Path, log_path: Path) -> None:
    _install_packages()
    source = tarball()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    if digest != SHA256:
        raise Slurm26Unavailable(f"{source} has sha256 {digest}, expected {SHA256}")
    with (
        tempfile.TemporaryDirectory(prefix="gpugap-slurm26-") as scratch,
        open(log_path, "w") as log,
    ):
        with tarfile.open(source) as archive:
            archive.extractall(scratch, filter="tar")
        tree = Path(scratch) / f"slurm-{VERSION}"
        jobs = str(max(2, os.cpu_count() or 2))
        steps = [
            ["./configure", f"--prefix={prefix}", f"--sysconfdir={prefix}/etc",
             "--with-rdkafka", "--with-json", "--with-jwt", "--with-yaml", "--disable-debug"],
            ["make", f"-j{jobs}"],
            ["make", "install"],
        ]  # fmt: skip
        for step in steps:
            proc = subprocess.run(
                step, cwd=tree, stdout=log, stderr=subprocess.STDOUT, check=False, timeout=3600
            )
            if proc.returncode != 0:
                log.flush()
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
                raise Slurm26Unavailable(f"{' '.join(step)} failed ({proc.returncode}):\n{tail}")
    missing = [p for p in PRODUCTS if not (prefix / p).exists()]
    if missing:
        raise Slurm26Unavailable(f"Slurm {VERSION} built without {missing}; see {log_path}")


if __name__ == "__main__":
    try:
        print(build())
    except Slurm26Unavailable as error:
        print(f"Slurm {VERSION}: {error}", file=sys.stderr)
        sys.exit(1)
