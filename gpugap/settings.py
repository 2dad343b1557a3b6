"""Typed, frozen configuration from the environment (prefix GPUGAP_, one per component).

Secrets are SecretStr: they print as '**********' and are never logged. Each secret can also
be read from a file (``..._FILE``), the usual way to mount them in containers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpugap.errors import ConfigError


def _read_secret(value: SecretStr | None, file: Path | None, what: str) -> SecretStr | None:
    if value is not None or file is None:
        return value
    try:
        return SecretStr(file.read_text().strip())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} from {file}: {exc.strerror}") from None


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, frozen=True, extra="ignore")


class KafkaSettings(BaseSettings):
    model_config = _config("GPUGAP_KAFKA_")

    bootstrap: str = Field(default="127.0.0.1:9092", description="host:port[,host:port...]")
    topic_prefix: str = Field(default="", description="namespace prepended to every topic name")
    client_id: str = "gpugap"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    compression: Literal["none", "gzip", "lz4", "zstd", "snappy"] = "lz4"
    linger_ms: int = Field(default=20, ge=0)
    max_batch_bytes: int = Field(default=1_048_576, gt=0)
    request_timeout_ms: int = Field(default=30_000, gt=0)

    @model_validator(mode="after")
    def _secret_file(self) -> Self:
        pw = _read_secret(self.sasl_password, self.sasl_password_file, "the Kafka SASL password")
        object.__setattr__(self, "sasl_password", pw)
        return self

    def client_options(self) -> dict[str, Any]:
        """Connection options shared by aiokafka producers, consumers and admin clients."""
        opts: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if self.sasl_mechanism:
            opts["sasl_mechanism"] = self.sasl_mechanism
            opts["sasl_plain_username"] = self.sasl_username
            if self.sasl_password is not None:
                opts["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return opts


class ClickHouseSettings(BaseSettings):
    model_config = _config("GPUGAP_CLICKHOUSE_")

    url: str = "http://127.0.0.1:8123"
    database: str = "gpugap"
    user: str = "default"
    password: SecretStr | None = None
    password_file: Path | None = None
    readonly_user: str = Field(default="reader", description="read-only user for BI tools")
    readonly_password: SecretStr | None = Field(
        default=None, description="enables the read-only user (the embedded endpoint)"
    )

    @model_validator(mode="after")
    def _secret_file(self) -> Self:
        pw = _read_secret(self.password, self.password_file, "the ClickHouse password")
        object.__setattr__(self, "password", pw)
        return self


class ServicesSettings(BaseSettings):
    """Local services started by ``gpugap services`` when no external ones are given."""

    model_config = _config("GPUGAP_SERVICES_")

    state_dir: Path = Field(default=Path("~/.local/state/gpugap").expanduser())
    cache_dir: Path = Field(default=Path("~/.cache/gpugap").expanduser())
    kafka_version: str = "4.1.1"
    kafka_home: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("GPUGAP_SERVICES_KAFKA_HOME", "KAFKA_HOME"),
        description="an unpacked Apache Kafka release to use instead of fetching jars",
    )
    kafka_host: str = "127.0.0.1"
    kafka_port: int = Field(default=9092, gt=0, lt=65536)
    kafka_controller_port: int = Field(default=9093, gt=0, lt=65536)
    kafka_heap: str = "512m"
    kafka_start_timeout_s: float = Field(default=90.0, gt=0)
    clickhouse_path: Path | None = Field(
        default=None,
        description="embedded ClickHouse data directory (default: STATE_DIR/clickhouse)",
    )
    clickhouse_host: str = "127.0.0.1"
    clickhouse_port: int = Field(default=8123, gt=0, lt=65536)


class Settings(BaseSettings):
    model_config = _config("GPUGAP_")

    cluster: str = Field(default="default", description="cluster name stamped on produced records")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    services: ServicesSettings = Field(default_factory=ServicesSettings)

    def masked(self) -> dict[str, Any]:
        """The effective configuration with every secret shown as '**********'."""
        data: dict[str, Any] = json.loads(self.model_dump_json())
        return data


def load() -> Settings:
    """Read settings from the environment; every validation problem becomes one line of a
    ConfigError that names the environment variable to fix."""
    from pydantic import ValidationError

    parts: dict[str, Any] = {}
    problems: list[str] = []
    components: dict[str, type[BaseSettings]] = {
        "kafka": KafkaSettings,
        "clickhouse": ClickHouseSettings,
        "services": ServicesSettings,
    }
    for field, cls in components.items():
        try:
            parts[field] = cls()
        except ConfigError as exc:
            problems.append(f"  {exc}")
        except ValidationError as exc:
            problems += _describe(exc, str(cls.model_config.get("env_prefix", "")))
    try:
        settings = Settings(**parts) if not problems else None
    except ValidationError as exc:
        problems += _describe(exc, "GPUGAP_")
    if problems or settings is None:
        raise ConfigError("invalid configuration:\n" + "\n".join(problems))
    return settings


def _describe(exc: Any, prefix: str) -> list[str]:
    return [f"  {prefix}{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()]
