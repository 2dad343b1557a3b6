"""Importing ``amdsmi``: the one place a wrong amdsmi/ROCm pairing is turned into one message.

The package is a ctypes wrapper that binds every C symbol of ``libamd_smi.so`` when it is
imported (``amdsmi_wrapper.py``), so a package newer than the host's ROCm fails at ``import
amdsmi`` -- with an ``AttributeError: ... undefined symbol``, a ``KeyError: 'libamd_smi.so'``
(the 2024 wrapper, library not found), an ``OSError`` (newer wrappers) or an ``ImportError``
-- not at the first call (tests/fixtures/amd/NOTES.md, "Wrong amdsmi and ROCm pairing").
AMD's fix is to install the package shipped with the installed ROCm (ROCm/TheRock#7890).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from types import ModuleType

from gpugap.schemas.errors import ConfigError

FIX = "pip uninstall amdsmi; pip install /opt/rocm/share/amd_smi"
_LIBRARY = re.compile(r"(/\S*libamd_smi\.so[\w.]*)")


def package_version() -> str:
    try:
        return importlib.metadata.version("amdsmi")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def load_amdsmi() -> ModuleType:
    """``import amdsmi``, or one ConfigError naming the package, the library's error and the fix."""
    try:
        return importlib.import_module("amdsmi")
    except ModuleNotFoundError as exc:
        if exc.name == "amdsmi":
            raise ConfigError(
                "gpugap produce amdsmi needs the amdsmi Python package of this host's ROCm, "
                f"which is not installed: {FIX} (PyPI's wheel is often older than the host's "
                "ROCm, so gpugap's extra does not pull it)"
            ) from None
        raise ConfigError(_mismatch(exc)) from None
    except (ImportError, OSError, AttributeError, KeyError) as exc:
        raise ConfigError(_mismatch(exc)) from None


def _mismatch(exc: BaseException) -> str:
    if isinstance(exc, KeyError):  # the 2024 wrapper: the library could not be loaded at all
        error = (
            f"KeyError {exc}: libamd_smi.so could not be loaded (is ROCm's amd-smi-lib installed?)"
        )
    else:
        error = f"{type(exc).__name__}: {exc}"
    found = _LIBRARY.search(str(exc))
    library = f" against {found.group(1)}" if found else ""
    return (
        f"amdsmi: the amdsmi Python package (version {package_version()}) does not match this "
        f"host's ROCm library{library}: {error}. Install the package of the installed ROCm: "
        f"{FIX}"
    )
