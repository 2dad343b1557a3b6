"""Install extras: a node agent's install brings neither the stream engine nor the database,
and what it lacks is one line naming the extra. A real ``pip install '.[nvml]'`` into a fresh
virtualenv (wheels come from pip's cache after the first run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def nvml_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_dir = tmp_path_factory.mktemp("nvml-venv")
    venv.create(env_dir, with_pip=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    # from a copy of the tracked tree: the build writes build/ and *.egg-info where it runs,
    # and a stale build/lib from another layout would be packaged too
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in files:
        if name.startswith(("tests/", "benchmarks/", "docs/")):
            continue
        if (ROOT / name).is_symlink():  # gpugap/<part> -> ../<part>: the one root
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(ROOT / name), src / name)
        elif (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run(
        [*pip, "install", f"{src}[nvml]"],
        check=True,
        timeout=600,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    return env_dir


def _installed(env_dir: Path) -> set[str]:
    out = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {p["name"].lower().replace("_", "-") for p in json.loads(out)}


def _gpugap(env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUGAP_")}
    return subprocess.run(
        [str(env_dir / "bin" / "gpugap"), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=env_dir,  # not the checkout: the installed package only
        env={**clean, "PYTHONPATH": ""},
    )


def test_the_nvml_extra_installs_the_agent_and_nothing_heavy(nvml_venv: Path) -> None:
    names = _installed(nvml_venv)
    assert {"gpugap", "nvidia-ml-py", "grpcio", "protobuf", "aiokafka", "pydantic"} <= names
    heavy = {"faust-streaming", "chdb", "kubernetes", "clickhouse-connect", "aiohttp"}
    assert not names & heavy, f"the nvml extra pulled {sorted(names & heavy)}"
    assert "requests" not in names  # a benchmark's dependency, not the product's


def test_the_console_script_runs_the_agent_help(nvml_venv: Path) -> None:
    run = _gpugap(nvml_venv, "produce", "nvml", "--help")
    assert run.returncode == 0, run.stderr
    assert "--pod-resources-socket" in run.stdout and "--once" in run.stdout
    listed = _gpugap(nvml_venv, "produce", "--help")
    assert listed.returncode == 0 and "kubernetes" in listed.stdout  # all are listed


@pytest.mark.parametrize(
    ("argv", "extra", "dist"),
    [
        (["produce", "kubernetes", "--once"], "kubernetes", "kubernetes"),
        (["produce", "dcgm", "--once"], "dcgm", "aiohttp"),
        (["sink", "clickhouse"], "clickhouse", "clickhouse-connect"),
        (["worker"], "worker", "faust-streaming"),
        (["clickhouse", "serve"], "local", "chdb"),
        (["report"], "clickhouse", "clickhouse-connect"),
        (["notify", "slack"], "notify", "aiohttp"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(
    nvml_venv: Path, argv: list[str], extra: str, dist: str
) -> None:
    run = _gpugap(nvml_venv, *argv)
    assert run.returncode == 2, (run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert f"pip install 'gpugap[{extra}]'" in lines[0] and dist in lines[0]


def test_the_checkout_is_not_what_ran(nvml_venv: Path) -> None:
    """The console script imports the installed copy (site-packages), not this checkout."""
    code = "import gpugap.producers as p, gpugap; print(p.__file__); print(gpugap.__file__)"
    out = subprocess.run(
        [str(nvml_venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        cwd=nvml_venv,
        check=True,
    ).stdout
    assert str(ROOT) not in out and "site-packages" in out
    assert sys.prefix != str(nvml_venv)


def test_gpugap_claims_one_import_name_beside_a_package_with_its_own_schemas(
    nvml_venv: Path, tmp_path: Path
) -> None:
    """Everything installs under ``gpugap``: a package that ships a top-level ``schemas`` (or
    ``streams``, ``sinks``...) installed beside it keeps its own, and gpugap keeps working."""
    python = str(nvml_venv / "bin" / "python")
    top = subprocess.run(
        [python, "-c", "import importlib.metadata as m; "
         "print(sorted({f.parts[0] for f in m.files('gpugap') if f.suffix == '.py'}))"],
        check=True, capture_output=True, text=True, cwd=tmp_path,  # not this checkout's egg-info
    ).stdout.strip()  # fmt: skip
    assert top == "['gpugap']", top
    other = tmp_path / "other"
    (other / "schemas").mkdir(parents=True)
    (other / "schemas" / "__init__.py").write_text('WHO = "the other package"\n')
    (other / "pyproject.toml").write_text(
        '[project]\nname = "other-schemas"\nversion = "1.0"\n'
        '[tool.setuptools]\npackages = ["schemas"]\n'
    )
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", str(other)], check=True, timeout=300)
    try:
        both = subprocess.run(
            [python, "-c", "import schemas, gpugap.schemas; print(schemas.WHO); "
             "print(gpugap.schemas.GpuSample.__module__)"],
            check=True, capture_output=True, text=True, cwd=tmp_path,
        ).stdout.split("\n")  # fmt: skip
        assert both[:2] == ["the other package", "gpugap.schemas.models"], both
        assert _gpugap(nvml_venv, "--version").returncode == 0
    finally:
        subprocess.run([*pip, "uninstall", "-y", "other-schemas"], check=True, timeout=300)
