"""docker-compose.yml without Docker: valid against the Compose Specification's JSON Schema
(vendored, see tests/fixtures/compose/SOURCE.md), every gpugap service's command is a real
command of this CLI, and every GPUGAP_* variable it sets is a real setting that validates."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml  # type: ignore[import-untyped]
from pydantic_settings import BaseSettings

from gpugap import producers
from gpugap.cli import build_parser
from gpugap.groundfloor.settings import Settings, load

ROOT = Path(__file__).parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SPEC = json.loads((ROOT / "tests" / "fixtures" / "compose" / "compose-spec.json").read_text())
GPUGAP = {name: s for name, s in COMPOSE["services"].items() if s.get("image") == "gpugap:local"}


def test_valid_against_the_compose_specification() -> None:
    jsonschema.Draft202012Validator.check_schema(SPEC)
    errors = sorted(
        jsonschema.Draft202012Validator(SPEC).iter_errors(COMPOSE), key=lambda e: list(e.path)
    )
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_stack_is_complete() -> None:
    services = COMPOSE["services"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    commands = {name: s["command"][:2] for name, s in GPUGAP.items()}
    assert commands["migrate"] == ["db", "migrate"]
    assert commands["worker"][0] == "worker"
    assert commands["sink"] == ["sink", "clickhouse"]
    assert commands["simulator"][0] == "simulate"
    assert 'ENTRYPOINT ["gpugap"]' in (ROOT / "Dockerfile").read_text()


@pytest.mark.parametrize("name", sorted(GPUGAP))
def test_gpugap_commands_exist(name: str) -> None:
    command = GPUGAP[name]["command"]
    try:
        args = build_parser().parse_args(command)
    except SystemExit:
        pytest.fail(f"service {name}: `gpugap {' '.join(command)}` is not a valid command")
    assert callable(args.func)


def test_dependencies_wait_for_what_they_need() -> None:
    services = COMPOSE["services"]
    for name, service in services.items():
        for dep, rule in service.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s health"
            if rule["condition"] == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} must run once"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert source in COMPOSE["volumes"], f"{name}: {source} is not a named volume"


def _names(kind: type[BaseSettings]) -> set[str]:
    prefix = str(kind.model_config.get("env_prefix", ""))
    names = set()
    for sub, sub_info in kind.model_fields.items():
        names.add(f"{prefix}{sub}".upper())
        alias = sub_info.validation_alias
        names.update(getattr(alias, "choices", []) if alias else [])
    return names


def setting_names() -> set[str]:
    """Every environment variable gpugap's settings read: the shared ones and each
    producer's own (its plugin's settings class)."""
    names = set()
    for field, info in Settings.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseSettings):
            names |= _names(kind)
        else:
            names.add(f"GPUGAP_{field}".upper())
    for name in producers.REGISTRY:
        own = producers.plugin(name).settings
        if own is not None:
            names |= _names(own)
    return names


def test_one_image_target_per_component_extra() -> None:
    """The Dockerfile builds one image per component from its install extra, and the last
    stage (the one docker-compose.yml builds) has everything."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    stages = re.findall(
        r'^FROM \S+ AS (\w+)\nRUN pip install "\.\[([\w,]+)\]"$',
        (ROOT / "Dockerfile").read_text(),
        re.M,
    )
    built = dict(stages)
    assert stages[-1] == ("all", "all")
    for component in ("nvml", "dcgm", "kubernetes", "slurm", "worker"):
        assert built[component] == component and component in extras
    assert built["sink"] == "clickhouse" and "clickhouse" in extras
    assert "tests" in (ROOT / ".dockerignore").read_text().split()


def test_the_image_copies_every_part_the_package_links_in() -> None:
    """gpugap/<part> links to a folder at the top (the one root): the image copies each."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    parts = [p.name for p in (ROOT / "gpugap").iterdir() if p.is_symlink()]
    assert len(parts) == 6, parts
    for part in parts:
        assert f"COPY {part} ./{part}\n" in dockerfile, part


def _interpolate(value: Any) -> str:
    """Compose's ${VAR:-default} with VAR unset."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", str(value))


@pytest.mark.parametrize("name", sorted(GPUGAP))
def test_environment_names_are_settings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: _interpolate(v) for k, v in GPUGAP[name]["environment"].items()}
    unknown = {k for k in env if k.startswith("GPUGAP_")} - setting_names()
    assert not unknown, f"service {name} sets variables no setting reads: {sorted(unknown)}"
    for key in [k for k in os.environ if k.startswith("GPUGAP_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load()  # the values validate, too
    assert settings.kafka.bootstrap == "kafka:9092"
    assert settings.clickhouse.url == "http://clickhouse:8123"
    assert settings.clickhouse.password is not None
