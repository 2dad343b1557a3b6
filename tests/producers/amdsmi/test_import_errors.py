"""A wrong amdsmi/ROCm pairing fails at ``import amdsmi``: the agent says so in one error.

Each case raises, at import, the exception of a recorded traceback (tests/fixtures/amd/
SOURCES.md, "amdsmi Python package: error texts"): ROCm/amdsmi#186 and #98 (undefined
symbol), modular/rules_mojo#14 (missing attribute); and from NOTES.md the 2024 wrapper's
``KeyError: 'libamd_smi.so'`` (amdsmi repo ``amdsmi_wrapper.py`` L181) and the newer
wrappers' ``OSError("Could not load libamd_smi.so")`` (ROCm/TheRock#1626).
"""

from __future__ import annotations

import builtins
import importlib.util
from pathlib import Path

import pytest

from gpugap.cli import main
from gpugap.producers.amdsmi.loader import FIX, load_amdsmi
from gpugap.schemas.errors import ConfigError
from tests.harness.amdsmi_fake import failing_import

FIXTURES = Path(__file__).parents[2] / "fixtures" / "amd"


def recorded(name: str) -> BaseException:
    """The exception on the last line of a recorded traceback ("AttributeError: ...")."""
    last = (FIXTURES / name).read_text().strip().splitlines()[-1]
    kind, _, message = last.partition(": ")
    exc_type = getattr(builtins, kind)
    assert issubclass(exc_type, BaseException)
    return exc_type(message)


CASES = [
    (
        recorded("amdsmi_error_undefined_symbol_issue186.txt"),
        "7.1.1",
        ["/opt/rocm-7.0.1/lib/libamd_smi.so", "amdsmi_get_gpu_partition_metrics_info"],
    ),
    (
        recorded("amdsmi_error_undefined_symbol_issue98.txt"),
        "7.0.2",
        ["/opt/rocm-6.4.0/lib/libamd_smi.so", "undefined symbol: amdsmi_get_gpu_busy_percent"],
    ),
    (
        recorded("amdsmi_error_missing_attribute_rules_mojo14.txt"),
        "6.4.1",
        ["has no attribute 'amdsmi_get_gpu_kfd_info'"],
    ),
    (KeyError("libamd_smi.so"), "6.2.0", ["KeyError 'libamd_smi.so'", "amd-smi-lib"]),
    (OSError("Could not load libamd_smi.so"), None, ["OSError: Could not load libamd_smi.so"]),
    (ImportError("cannot import name 'amdsmi_wrapper'"), "7.2.0", ["ImportError"]),
]


@pytest.mark.parametrize(("exc", "version", "says"), CASES)
def test_mismatch_is_one_clear_error(
    exc: BaseException, version: str | None, says: list[str]
) -> None:
    with failing_import(exc, version), pytest.raises(ConfigError) as raised:
        load_amdsmi()
    message = str(raised.value)
    assert "\n" not in message
    assert f"version {version or 'unknown'}" in message
    assert FIX in message  # pip uninstall amdsmi; pip install /opt/rocm/share/amd_smi
    for part in says:
        assert part in message


def test_library_path_is_named() -> None:
    exc = recorded("amdsmi_error_undefined_symbol_issue186.txt")
    where = r"against /opt/rocm-7\.0\.1/lib/libamd_smi\.so:"
    with failing_import(exc, "7.1.1"), pytest.raises(ConfigError, match=where):
        load_amdsmi()


def test_package_missing_says_where_it_comes_from() -> None:
    missing = ModuleNotFoundError("No module named 'amdsmi'", name="amdsmi")
    with failing_import(missing), pytest.raises(ConfigError, match="pip uninstall amdsmi"):
        load_amdsmi()


def test_cli_prints_one_line_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("amd_exporter", "xpum"):  # the CLI imports every registered declaration
        if importlib.util.find_spec(f"gpugap.producers.{name}") is None:
            pytest.skip(f"the CLI needs gpugap.producers.{name}, not in this tree yet")
    exc = recorded("amdsmi_error_undefined_symbol_issue98.txt")
    with failing_import(exc, "7.0.2"):
        rc = main(["produce", "amdsmi", "--out", str(tmp_path / "s.jsonl"), "--once"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("gpugap: error: amdsmi: the amdsmi Python package (version 7.0.2)")
    assert "Traceback" not in err[0]
