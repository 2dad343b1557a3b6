"""The real client libraries BI tools embed, fetched and built once into a cache outside the
repository (~/.cache/gpugap/drivers/<name>-<version>/, or $GPUGAP_DRIVER_CACHE) and reused.

Each function builds what is missing and returns the path; a build that fails raises
DriverBuildError with the tool's output, and the tests turn that into a failure, never a skip.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# the clients' sources: tests/bi/go, java, js
HERE = Path(__file__).resolve().parents[1] / "bi"
CLICKHOUSE_GO = "v2.47.0"  # what grafana/clickhouse-datasource pins in its go.mod
JDBC_VERSIONS = ("0.9.9", "0.10.0")
JS_CLIENT = "1.23.1"
BUILD_LOG: dict[str, float] = {}  # what was built in this session and how long it took (s)


class DriverBuildError(RuntimeError):
    pass


def cache_root() -> Path:
    given = os.environ.get("GPUGAP_DRIVER_CACHE")
    return Path(given) if given else Path.home() / ".cache" / "gpugap" / "drivers"


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(what: str, cmd: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 900) -> None:  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DriverBuildError(f"{what}: {' '.join(cmd)} could not run: {exc}") from exc
    if proc.returncode != 0:
        raise DriverBuildError(
            f"{what}: {' '.join(cmd)} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )


def _tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise DriverBuildError(f"{name} is not installed (needed to build the BI client)")
    return found


# --- clickhouse-go (Grafana) -----------------------------------------------------------------


def clickhouse_go() -> Path:
    """The bicheck binary (tests/bi/go) built against clickhouse-go v2.47.0; keyed by a hash
    of its sources, so an edited program is rebuilt."""
    src = HERE / "go"
    files = sorted(p for p in src.iterdir() if p.suffix in (".go", ".mod", ".sum"))
    out_dir = cache_root() / f"clickhouse-go-{CLICKHOUSE_GO.lstrip('v')}"
    binary = out_dir / f"bicheck-{_digest(*files)}"
    if binary.exists():
        return binary
    go = _tool("go")
    with _locked(out_dir):
        if binary.exists():
            return binary
        work = out_dir / "src"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work)
        tmp = binary.with_suffix(".tmp")
        start = time.monotonic()
        _run(
            "building the clickhouse-go program",
            [go, "build", "-o", str(tmp), "."],
            work,
            env={"GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"},
        )
        tmp.rename(binary)
        for old in out_dir.glob("bicheck-*"):  # builds of earlier sources
            if old != binary:
                old.unlink(missing_ok=True)
        BUILD_LOG[f"clickhouse-go {CLICKHOUSE_GO}"] = time.monotonic() - start
    return binary


# --- ClickHouse JDBC (DBeaver, Metabase, Tableau) ---------------------------------------------

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>gpugap.tests</groupId><artifactId>bi-jdbc</artifactId><version>1</version>
  <dependencies>
    <dependency>
      <groupId>com.clickhouse</groupId><artifactId>clickhouse-jdbc</artifactId>
      <version>{version}</version>{classifier}
      <exclusions>
        <!-- zstd-jni's "cloud" classifier is not on Maven Central -->
        <exclusion><groupId>com.github.luben</groupId><artifactId>zstd-jni</artifactId></exclusion>
      </exclusions>
    </dependency>
    <!-- the shaded jar leaves slf4j to the application -->
    <dependency>
      <groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>2.0.7</version>
    </dependency>
  </dependencies>
</project>
"""


def jdbc(version: str) -> str:
    """A Java class path: the driver (the shaded ``all`` jar for 0.9.x, the jar and its
    resolved dependencies for 0.10) and BiCheck compiled against it."""
    out_dir = cache_root() / f"clickhouse-jdbc-{version}"
    lib = out_dir / "lib"
    source = HERE / "java" / "BiCheck.java"
    classes = out_dir / f"classes-{_digest(source)}"
    with _locked(out_dir):
        if not (lib / ".complete").exists():
            mvn = _tool("mvn")
            shutil.rmtree(lib, ignore_errors=True)
            classifier = "<classifier>all</classifier>" if version.startswith("0.9") else ""
            (out_dir / "pom.xml").write_text(_POM.format(version=version, classifier=classifier))
            start = time.monotonic()
            _run(
                f"fetching clickhouse-jdbc {version}",
                [mvn, "-B", "-q", "-f", "pom.xml", "dependency:copy-dependencies",
                 f"-DoutputDirectory={lib}"],
                out_dir,
            )  # fmt: skip
            if not any(lib.glob("clickhouse-jdbc-*.jar")):
                raise DriverBuildError(f"clickhouse-jdbc {version}: no driver jar in {lib}")
            (lib / ".complete").touch()
            BUILD_LOG[f"clickhouse-jdbc {version} (mvn)"] = time.monotonic() - start
        if not (classes / "BiCheck.class").exists():
            javac = _tool("javac")
            tmp = out_dir / "classes.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            start = time.monotonic()
            _run(
                "compiling BiCheck.java",
                [javac, "-d", str(tmp), "-cp", f"{lib}/*", str(source)],
                out_dir,
            )
            tmp.rename(classes)
            BUILD_LOG[f"BiCheck.java for jdbc {version} (javac)"] = time.monotonic() - start
    return f"{classes}{os.pathsep}{lib}/*"


# --- @clickhouse/client (Node) -----------------------------------------------------------------


def js_client() -> Path:
    """A directory with node_modules/@clickhouse/client installed (npm install --prefix)."""
    out_dir = cache_root() / f"clickhouse-client-js-{JS_CLIENT}"
    marker = out_dir / "node_modules" / "@clickhouse" / "client" / "package.json"
    if marker.exists():
        return out_dir
    npm = _tool("npm")
    with _locked(out_dir):
        if marker.exists():
            return out_dir
        start = time.monotonic()
        _run(
            f"installing @clickhouse/client {JS_CLIENT}",
            [npm, "install", "--prefix", str(out_dir), "--no-audit", "--no-fund",
             "--no-save", f"@clickhouse/client@{JS_CLIENT}"],
            out_dir,
        )  # fmt: skip
        if not marker.exists():
            raise DriverBuildError(f"npm install left no {marker}")
        BUILD_LOG[f"@clickhouse/client {JS_CLIENT} (npm)"] = time.monotonic() - start
    return out_dir
