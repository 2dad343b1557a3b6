"""The one seam for parts found by name: producers and sinks each declare a ``Plugin`` beside
their code (``producers/<tech>/plugin.py``, ``sinks/<tech>/plugin.py``), and a registry line
(``producers.REGISTRY``, ``sinks.REGISTRY``) names it. The CLI builds ``gpugap produce NAME``
and ``gpugap sink NAME`` from the registries, with each plugin's own options.

A declaration imports only pydantic and its settings class: ``gpugap produce --help`` lists
every producer without their libraries installed. The part's code (and its dependencies) is
imported when it runs; a missing dependency is one line naming the install extra.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from gpugap.schemas.errors import ConfigError

#: import name -> the distribution that provides it, for the missing-extra message
_DISTRIBUTIONS = {
    "pynvml": "nvidia-ml-py",
    "grpc": "grpcio",
    "google.protobuf": "protobuf",
    "prometheus_client": "prometheus-client",
    "faust": "faust-streaming",
    "clickhouse_connect": "clickhouse-connect",
    "chdb": "chdb",
    "kubernetes": "kubernetes",
    "aiohttp": "aiohttp",
    "brotli": "brotli",
    "lz4": "lz4",
    "cramjam": "cramjam",
    "backports.zstd": "backports.zstd",
    "jwt": "pyjwt[crypto]",
}


#: top-level import name -> the extra that installs it (for an import no command checked)
_EXTRAS = {
    "pynvml": "nvml",
    "grpc": "nvml",
    "google": "nvml",
    "prometheus_client": "dcgm",
    "kubernetes": "kubernetes",
    "faust": "worker",
    "mode": "worker",
    "clickhouse_connect": "clickhouse",
    "chdb": "local",
    "aiohttp": "local",
    "brotli": "local",
    "lz4": "local",
    "cramjam": "local",
    "backports": "local",
    "jwt": "signon",
}

#: what the embedded ClickHouse endpoint imports (extra ``local``)
LOCAL_MODULES = ("chdb", "aiohttp", "lz4", "brotli", "backports.zstd", "cramjam")


def missing_extra(exc: ModuleNotFoundError) -> tuple[str, str] | None:
    """(extra, distribution) that would have installed the module ``exc`` did not find
    (None: not a module an extra installs)."""
    name = exc.name or ""
    extra = _EXTRAS.get(name.split(".")[0])
    return None if extra is None else (extra, _DISTRIBUTIONS.get(name, name.split(".")[0]))


class MissingExtra(ConfigError):
    """A command needs a library its install extra brings, and it is not installed."""


def require(what: str, extra: str, modules: tuple[str, ...]) -> None:
    """Raise MissingExtra (one line: what to install) unless every module can be imported."""
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing (google.protobuf)
            found = False
        if not found:
            dist = _DISTRIBUTIONS.get(name, name)
            raise MissingExtra(
                f"{what} needs {dist}, which is not installed: pip install 'gpugap[{extra}]'"
            )


@dataclass(frozen=True)
class Option:
    """A command-line flag that overrides one settings field (``--endpoint`` -> ``endpoints``).
    ``kwargs`` go to argparse's ``add_argument`` (action, metavar, type...)."""

    flag: str
    field: str
    help: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Plugin:
    """A producer or sink: its name, what it does, the extra that brings its dependencies,
    where its code is (``"module:callable"``, imported when it runs), its settings class
    (read from the environment, its own prefix) and its flags."""

    name: str
    help: str
    extra: str
    target: str
    settings: type[BaseSettings] | None = None
    options: tuple[Option, ...] = ()
    requires: tuple[str, ...] = ()
    kind: str = "produce"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        for opt in self.options:
            parser.add_argument(opt.flag, dest=f"opt_{opt.field}", help=opt.help, **opt.kwargs)

    def config(self, args: argparse.Namespace | None = None) -> BaseSettings | None:
        """The plugin's settings: the environment, then the flags given on the command line."""
        if self.settings is None:
            return None
        prefix = str(self.settings.model_config.get("env_prefix", ""))
        try:
            cfg = self.settings()
            given = {
                o.field: v
                for o in self.options
                if (v := getattr(args, f"opt_{o.field}", None)) not in (None, False)
            }
            if given:  # validated like the environment's values (paths, bounds)
                cfg = self.settings.model_validate({**cfg.model_dump(), **given})
        except ValidationError as exc:
            lines = [
                f"  {prefix}{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}"
                for e in exc.errors()
            ]
            raise ConfigError(f"invalid {self.name} configuration:\n" + "\n".join(lines)) from None
        return cfg

    def load(self) -> Any:
        """The part's constructor, imported now; a missing dependency names the extra."""
        require(f"gpugap {self.kind} {self.name}", self.extra, self.requires)
        module, _, attr = self.target.partition(":")
        try:
            target = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] == "gpugap":  # our own code: a bug, not an extra
                raise
            raise MissingExtra(
                f"gpugap {self.kind} {self.name} needs {exc.name}, which is not installed: "
                f"pip install 'gpugap[{self.extra}]'"
            ) from None
        return target


def lookup(registry: Mapping[str, str], name: str, what: str) -> Plugin:
    """The plugin a registry line names (``"module:ATTRIBUTE"``)."""
    try:
        module, _, attr = registry[name].partition(":")
    except KeyError:
        known = ", ".join(sorted(registry)) or "none in this build"
        raise ConfigError(f"unknown {what} {name!r} (known: {known})") from None
    plugin: Plugin = getattr(importlib.import_module(module), attr)
    return plugin
