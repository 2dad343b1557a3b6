"""The systemd units of the Slurm side (deploy/slurm/*.service: the poller, the spool drainer,
the jobcomp/kafka consumer, slurmctld's metrics)
pass ``systemd-analyze verify``, run real gpugap commands and set only settings the code reads.

``systemd-analyze verify`` works offline: it loads the unit files itself and needs no systemd
as PID 1 (none runs here). It does check that ExecStart names an existing executable, so each
unit is verified as a temporary copy whose ExecStart points at this checkout's gpugap (the
units name /opt/gpugap/venv/bin/gpugap, where the install guide puts it); nothing else of the
unit is changed. verify exits 0 on an unknown key or a value it cannot parse ("..., ignoring"),
so any message it prints fails the test too.
"""

from __future__ import annotations

import importlib
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.services import unavailable

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy").rglob("*.service"))
INSTALLED = "/opt/gpugap/venv/bin/gpugap"


def _analyze() -> str:
    found = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    if not Path(found).exists():
        unavailable("systemd-analyze is not installed (Debian: apt-get install systemd)")
    return found


def _gpugap() -> Path:
    exe = Path(sys.executable).with_name("gpugap")
    assert exe.exists(), f"{exe}: the venv's gpugap entry point (pip install -e .)"
    return exe


def verify(unit: Path, tmp: Path) -> str:
    """``systemd-analyze verify`` on a copy of ``unit`` with ExecStart pointing at this venv's
    gpugap; returns what it printed (rc and messages)."""
    text = unit.read_text()
    assert f"ExecStart={INSTALLED} " in text, f"{unit.name}: ExecStart is not {INSTALLED} ..."
    copy = tmp / unit.name
    copy.write_text(text.replace(f"ExecStart={INSTALLED} ", f"ExecStart={_gpugap()} "))
    proc = subprocess.run(
        [_analyze(), "verify", "--man=no", str(copy)],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "SYSTEMD_PAGER": "", "SYSTEMD_LOG_COLOR": "0"},
    )  # fmt: skip
    out = (proc.stdout + proc.stderr).strip()
    return f"rc {proc.returncode}: {out}" if (proc.returncode or out) else ""


def exec_start(unit: Path) -> list[str]:
    (line,) = [ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def environment(unit: Path) -> Iterator[str]:
    for line in unit.read_text().splitlines():
        m = re.match(r"#?Environment=([A-Z0-9_]+)=", line)
        if m:
            yield m.group(1)


def test_the_slurm_side_has_its_units() -> None:
    commands = {tuple(exec_start(u)[1:3]) for u in UNITS}
    assert ("produce", "slurm") in commands  # the poller
    assert ("slurm-hook", "drain") in commands  # the spool drainer
    assert ("produce", "slurm-jobcomp") in commands  # Slurm's own records, no hook
    assert ("produce", "slurm-metrics") in commands  # slurmctld's own count
    for unit in UNITS:
        if exec_start(unit)[1:3] == ["slurm-hook", "drain"]:
            assert "--follow" in exec_start(unit), f"{unit.name}: a service must keep running"


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    assert verify(unit, tmp_path) == ""


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """What the test above would report: an unknown key, a bad value, a missing executable."""
    src = next(u for u in UNITS if exec_start(u)[1:3] == ["produce", "slurm"])
    broken = tmp_path / "src"
    broken.mkdir()
    bad = broken / src.name
    bad.write_text(src.read_text().replace("Restart=always", "Restart=sometimes\nExecStrat=x"))
    out = verify(bad, tmp_path)
    assert "ExecStrat" in out and "sometimes" in out, out
    missing = tmp_path / "missing"
    missing.mkdir()
    moved = src.read_text().replace(f"{INSTALLED} ", "/nonexistent/gpugap ")
    (missing / src.name).write_text(moved)
    proc = subprocess.run(
        [_analyze(), "verify", "--man=no", str(missing / src.name)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "is not executable" in proc.stderr, proc.stderr


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_units_run_real_commands_and_settings(unit: Path) -> None:
    from pydantic_settings import BaseSettings

    from gpugap.cli import build_parser

    argv = exec_start(unit)[1:]
    ns = build_parser().parse_args(argv)  # SystemExit on an unknown command or flag
    if ns.command == "slurm-hook":  # its own parser (no heavy imports for slurmctld's hook)
        proc = subprocess.run(
            [str(_gpugap()), *argv[:2], "--help"], capture_output=True, text=True, check=True
        )
        for flag in [a for a in ns.rest if a.startswith("--")]:
            assert re.search(rf"\s{re.escape(flag)}\b", proc.stdout), f"{flag}?\n{proc.stdout}"
    for mod in (
        "gpugap.groundfloor.settings",
        "gpugap.producers.slurm.settings",
        "gpugap.producers.slurm.poll_settings",
        "gpugap.producers.slurm.jobcomp_settings",
    ):
        importlib.import_module(mod)

    def walk(cls: type[BaseSettings]) -> Iterator[type[BaseSettings]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    known = set()
    for cls in walk(BaseSettings):
        prefix = str(cls.model_config.get("env_prefix", ""))
        known |= {f"{prefix}{f}".upper() for f in cls.model_fields}
    unknown = sorted(set(environment(unit)) - known)
    assert not unknown, f"{unit.name}: {unknown} are read by nothing"
