"""Typed, frozen configuration from the environment (prefix GPUGAP_, one per component).

Secrets are SecretStr: they print as '**********' and are never logged. Each secret can also
be read from a file (``..._FILE``), the usual way to mount them in containers.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gpugap.schemas.errors import ConfigError
from gpugap.schemas.topics import K8S_PODS, SAMPLES, SLURM_JOBS, TRANSFERS
from gpugap.schemas.types import CLUSTER_PATTERN, Scheduler, WorkloadClass, normal_text

PartT = TypeVar("PartT", bound=BaseSettings)

if TYPE_CHECKING:
    import ssl


def read_secret(value: SecretStr | None, file: Path | None, what: str) -> SecretStr | None:
    if value is not None or file is None:
        return value
    try:
        return SecretStr(file.read_text().strip())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} from {file}: {exc.strerror}") from None


def _local_password(url: str) -> SecretStr | None:
    """The password the local default endpoint (``gpugap clickhouse serve`` with its default
    data directory) generated, for a client of a loopback URL given no password: never sent
    to another host."""
    host = (urlsplit(url).hostname or "").strip("[]")
    if host != "localhost" and not _loopback(host):
        return None
    services = ServicesSettings()
    data = services.clickhouse_path or services.state_dir / "clickhouse"
    generated = data.parent / f"{data.name}.password"
    try:
        return SecretStr(generated.read_text().strip()) if generated.is_file() else None
    except OSError:
        return None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_readable(path: Path, name: str) -> None:
    try:
        with path.open("rb"):
            pass
    except IsADirectoryError:
        raise ConfigError(f"{name}={path} is a directory, not a PEM file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {name}={path}: {exc.strerror or exc}") from None


def _no_password() -> str:
    return ""


#: the topics producers write: each record names the cluster it speaks for (``cluster``)
CLUSTER_TOPIC_SCHEMAS = (SAMPLES.name, SLURM_JOBS.name, K8S_PODS.name, TRANSFERS.name)


def cluster_topic_map(mapping: dict[str, str | list[str]]) -> dict[str, tuple[str, frozenset[str]]]:
    """``GPUGAP_KAFKA_CLUSTER_TOPICS`` resolved: topic name (without the namespace prefix) ->
    (the producer topic whose records it carries, the clusters they may claim).

    A key is a topic name that is a producer topic, or ends in ``.<producer topic>``
    (``cluster-a.gpu.samples.v1``), or starts with ``<producer topic>.``
    (``gpu.samples.v1.cluster-a``); or a prefix ending in ``*`` (``cluster-a.*``): that prefix
    before every producer topic. A value is a cluster name or a list of them. ValueError
    says what is wrong (docs/kafka-trust.md)."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    origin: dict[str, str] = {}
    for key, value in mapping.items():
        names = [value] if isinstance(value, str) else list(value)
        if not names:
            raise ValueError(f"{key!r}: no cluster (give one name or a list of names)")
        normal = [normal_text(c) for c in names]
        for given, c in zip(names, normal, strict=True):
            if not c or len(c) > 253 or not re.fullmatch(CLUSTER_PATTERN, c):
                raise ValueError(
                    f"{key!r}: {given!r} is not a cluster name (letters, digits, '.', '_' and "
                    "'-', from a letter or digit)"
                )
        clusters = frozenset(normal)
        if key.endswith("*"):
            pre = key[:-1]
            if "*" in pre:
                raise ValueError(f"{key!r}: '*' only at the end (a prefix: 'cluster-a.*')")
            topics = [(pre + t, t) for t in CLUSTER_TOPIC_SCHEMAS]
        else:
            if "*" in key:
                raise ValueError(f"{key!r}: '*' only at the end (a prefix: 'cluster-a.*')")
            found = [
                t
                for t in CLUSTER_TOPIC_SCHEMAS
                if key == t or key.endswith("." + t) or key.startswith(t + ".")
            ]
            if len(found) != 1:
                raise ValueError(
                    f"{key!r}: a cluster topic's name is a producer topic "
                    f"({', '.join(CLUSTER_TOPIC_SCHEMAS)}) with a prefix ending in '.' or a "
                    "suffix starting with '.', e.g. 'cluster-a.gpu.samples.v1'"
                    + (f" (it names {' and '.join(found)})" if found else "")
                )
            topics = [(key, found[0])]
        for name, schema in topics:
            if name in out:
                raise ValueError(f"{name!r} is mapped twice (by {origin[name]!r} and {key!r})")
            out[name], origin[name] = (schema, clusters), key
    _no_overlap(mapping)
    return out


def _no_overlap(mapping: dict[str, str | list[str]]) -> None:
    """A prefix (``lab.*``) may not cover another key (``lab.gpu.*``, ``lab.gpu.gpu.samples.v1``):
    the producers allowed the prefix's topics (a PREFIXED write ACL on ``lab.``) could write
    the other's, and claim its cluster (deploy/kafka-acls/kafka-acls.sh refuses the same)."""
    for key in mapping:
        if not key.endswith("*"):
            continue
        for other in mapping:
            if other != key and other.rstrip("*").startswith(key[:-1]):
                raise ValueError(
                    f"{key!r} covers {other!r}: the producers of {key[:-1]!r} topics could "
                    "write those of the other and claim its cluster; rename one prefix"
                )


def env_config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, frozen=True, extra="ignore")


class KafkaSettings(BaseSettings):
    model_config = env_config("GPUGAP_KAFKA_")

    bootstrap: str = Field(default="127.0.0.1:9092", description="host:port[,host:port...]")
    topic_prefix: str = Field(default="", description="namespace prepended to every topic name")
    client_id: str = "gpugap"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    # TLS (security_protocol SSL or SASL_SSL): PEM files, read when a client is created
    ssl_cafile: Path | None = Field(
        default=None, description="PEM CA bundle that signs the brokers (default: system CAs)"
    )
    ssl_certfile: Path | None = Field(
        default=None, description="PEM client certificate (chain), for brokers that require mTLS"
    )
    ssl_keyfile: Path | None = Field(
        default=None, description="PEM private key of SSL_CERTFILE (default: in SSL_CERTFILE)"
    )
    ssl_key_password: SecretStr | None = Field(
        default=None, description="passphrase of an encrypted SSL_KEYFILE"
    )
    ssl_key_password_file: Path | None = None
    ssl_check_hostname: bool = Field(
        default=True, description="the broker's certificate must name the host connected to"
    )
    compression: Literal["none", "gzip", "lz4", "zstd", "snappy"] = "zstd"
    linger_ms: int = Field(default=20, ge=0)
    max_batch_bytes: int = Field(default=1_048_576, gt=0)
    request_timeout_ms: int = Field(default=30_000, gt=0)
    cluster_topics: dict[str, str | list[str]] = Field(
        default_factory=dict,
        max_length=10_000,
        description="which cluster(s) records on a topic may claim, JSON: "
        '{"cluster-a.*": "cluster-a", "gpu.samples.v1.lab": ["lab1", "lab2"]}; a mapped '
        "cluster is then refused on every other topic of the same kind (docs/kafka-trust.md)",
    )

    @field_validator("cluster_topics")
    @classmethod
    def _cluster_topics(cls, value: dict[str, str | list[str]]) -> dict[str, str | list[str]]:
        cluster_topic_map(value)  # ValueError names the key
        return value

    def cluster_topic_map(self) -> dict[str, tuple[str, frozenset[str]]]:
        """Broker topic name (prefix included) -> (the producer topic it carries, the
        clusters its records may claim); empty without ``GPUGAP_KAFKA_CLUSTER_TOPICS``."""
        mapped = cluster_topic_map(self.cluster_topics)
        return {self.topic_prefix + name: v for name, v in mapped.items()}

    @model_validator(mode="after")
    def _secret_file(self) -> Self:
        pw = read_secret(self.sasl_password, self.sasl_password_file, "the Kafka SASL password")
        object.__setattr__(self, "sasl_password", pw)
        key_pw = read_secret(
            self.ssl_key_password, self.ssl_key_password_file, "the Kafka TLS key password"
        )
        object.__setattr__(self, "ssl_key_password", key_pw)
        return self

    @model_validator(mode="after")
    def _tls_files(self) -> Self:
        files = {
            "GPUGAP_KAFKA_SSL_CAFILE": self.ssl_cafile,
            "GPUGAP_KAFKA_SSL_CERTFILE": self.ssl_certfile,
            "GPUGAP_KAFKA_SSL_KEYFILE": self.ssl_keyfile,
        }
        given = [name for name, path in files.items() if path is not None]
        if not self.tls:
            if given:  # fail closed: never fall back to plaintext when TLS was meant
                raise ConfigError(
                    f"{', '.join(given)} set but GPUGAP_KAFKA_SECURITY_PROTOCOL="
                    f"{self.security_protocol}: set it to SSL or SASL_SSL (or unset them)"
                )
            return self
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ConfigError(
                "GPUGAP_KAFKA_SSL_KEYFILE needs GPUGAP_KAFKA_SSL_CERTFILE (the client certificate)"
            )
        for name, path in files.items():
            if path is not None:
                _check_readable(path, name)
        return self

    @property
    def tls(self) -> bool:
        """Whether connections to the brokers are TLS (security_protocol SSL or SASL_SSL)."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (None unless ``tls``): verifies the brokers against
        ``ssl_cafile`` (else the system CAs) and presents ``ssl_certfile`` when given.
        Files are read on each call, so a renewed certificate is picked up by new clients."""
        if not self.tls:
            return None
        import ssl

        what = f"GPUGAP_KAFKA_SSL_CAFILE={self.ssl_cafile}" if self.ssl_cafile else "system CAs"
        try:
            ctx = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH,
                cafile=str(self.ssl_cafile) if self.ssl_cafile is not None else None,
            )
            if self.ssl_certfile is not None:
                what = f"GPUGAP_KAFKA_SSL_CERTFILE={self.ssl_certfile}" + (
                    f", GPUGAP_KAFKA_SSL_KEYFILE={self.ssl_keyfile}" if self.ssl_keyfile else ""
                )
                key_pw = self.ssl_key_password
                ctx.load_cert_chain(
                    str(self.ssl_certfile),
                    str(self.ssl_keyfile) if self.ssl_keyfile is not None else None,
                    # never OpenSSL's interactive prompt: an encrypted key without a password
                    # is an error, not a daemon waiting on a terminal
                    password=key_pw.get_secret_value() if key_pw is not None else _no_password,
                )
        except ssl.SSLError as exc:
            hint = (
                " (an encrypted key needs GPUGAP_KAFKA_SSL_KEY_PASSWORD)"
                if (self.ssl_certfile is not None and self.ssl_key_password is None)
                else ""
            )
            raise ConfigError(f"Kafka TLS: cannot load {what}: {exc.reason or exc}{hint}") from None
        except OSError as exc:
            raise ConfigError(f"Kafka TLS: cannot read {what}: {exc.strerror or exc}") from None
        ctx.check_hostname = self.ssl_check_hostname  # verify_mode stays CERT_REQUIRED
        return ctx

    def client_options(self) -> dict[str, Any]:
        """Connection options shared by aiokafka producers, consumers and admin clients
        (with the TLS context for SSL and SASL_SSL)."""
        opts: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        ctx = self.ssl_context()
        if ctx is not None:
            opts["ssl_context"] = ctx
        if self.sasl_mechanism:
            opts["sasl_mechanism"] = self.sasl_mechanism
            opts["sasl_plain_username"] = self.sasl_username
            if self.sasl_password is not None:
                opts["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return opts


class ClickHouseSettings(BaseSettings):
    model_config = env_config("GPUGAP_CLICKHOUSE_")

    url: str = "http://127.0.0.1:8123"
    database: str = "gpugap"
    user: str = "default"
    password: SecretStr | None = None
    password_file: Path | None = None
    readonly_user: str = Field(default="reader", description="read-only user for BI tools")
    readonly_password: SecretStr | None = Field(
        default=None, description="enables the read-only user (the embedded endpoint)"
    )
    readonly_password_file: Path | None = None
    scoped_users_file: Path | None = Field(
        default=None,
        description="the embedded endpoint's BI users of one team or one person (JSON: "
        "docs/security.md#who-sees-what)",
    )

    @model_validator(mode="after")
    def _secret_file(self) -> Self:
        pw = read_secret(self.password, self.password_file, "the ClickHouse password")
        if pw is None and self.password_file is None:
            pw = _local_password(self.url)
        object.__setattr__(self, "password", pw)
        ro = read_secret(
            self.readonly_password, self.readonly_password_file, "the read-only user's password"
        )
        object.__setattr__(self, "readonly_password", ro)
        return self


class ServicesSettings(BaseSettings):
    """Local services started by ``gpugap services`` when no external ones are given."""

    model_config = env_config("GPUGAP_SERVICES_")

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


def comma_list(value: object) -> object:
    """Lists in the environment: comma-separated (``a,b``) or JSON (``["a", "b"]``)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [v.strip() for v in text.split(",") if v.strip()]
    return value


CommaList = Annotated[list[str], NoDecode]


def optional_path(value: object) -> object:
    """An empty value (``GPUGAP_..._SOCKET=``) turns a default path off."""
    off = isinstance(value, str) and value.strip().lower() in ("", "none", "off")
    return None if off else value


class AllocationMatch(BaseModel):
    """Which allocations: every field given must match, shell-style patterns (``dev-*``);
    ``labels``: each key must be among the allocation's labels (Kubernetes: those the
    producer carries, GPUGAP_K8S_CARRY_LABELS; Slurm: ``slurm.account``, ``slurm.qos``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str | None = None
    scheduler: Scheduler | None = None
    workload_class: WorkloadClass | None = None
    namespace: str | None = None
    partition: str | None = None
    owner: str | None = None
    team: str | None = None
    name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)

    def matches_something(self) -> bool:
        return bool(self.labels) or any(
            getattr(self, f) is not None for f in AllocationMatch.model_fields if f != "labels"
        )


class IdleExemption(AllocationMatch):
    """Allocations whose idle GPUs open no alert (``GPUGAP_IDLE_EXEMPT``, a JSON list); with
    ``younger_than_minutes`` only while the allocation is younger than that."""

    younger_than_minutes: int | None = Field(default=None, ge=1, le=7 * 1440)

    @model_validator(mode="after")
    def _something(self) -> Self:
        if not self.matches_something() and self.younger_than_minutes is None:
            raise ValueError("an exemption with no field would exempt every allocation")
        return self


class IdleRule(AllocationMatch):
    """``GPUGAP_IDLE_RULES``, a JSON list: the first rule whose fields match an allocation
    sets its threshold, minutes and reminders (what it leaves unset stays the class's)."""

    id: str | None = Field(default=None, max_length=200, description="named in alerts")
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    minutes: int | None = Field(default=None, ge=1, le=1440)
    remind_minutes: list[Annotated[int, Field(ge=1, le=7 * 1440)]] | None = Field(
        default=None, max_length=20
    )

    @model_validator(mode="after")
    def _something(self) -> Self:
        if not self.matches_something():
            raise ValueError("a rule with no field to match would apply to every allocation")
        if self.threshold is None and self.minutes is None and self.remind_minutes is None:
            raise ValueError("a rule sets threshold, minutes or remind_minutes")
        return self


class IdleSettings(BaseSettings):
    """``GPUGAP_IDLE_*``: the idle policy, one source for the stream's alerts, the warehouse's
    rollups and ``v_idle_now`` (the sink writes it into ``idle_policy``)."""

    model_config = env_config("GPUGAP_IDLE_")

    threshold: float = Field(
        default=0.05, ge=0.0, le=1.0, description="an allocated GPU below this activity is idle"
    )
    minutes: int = Field(default=10, ge=1, le=1440, description="idle minutes before an alert")
    class_thresholds: dict[WorkloadClass, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=dict, description='per class, JSON: {"interactive": 0.02}'
    )
    class_minutes: dict[WorkloadClass, Annotated[int, Field(ge=1, le=1440)]] = Field(
        default_factory=dict, description='per class, JSON: {"interactive": 60}'
    )
    remind_minutes: Annotated[list[Annotated[int, Field(ge=1, le=7 * 1440)]], NoDecode] = Field(
        default_factory=list,
        max_length=20,
        description="the notifier reminds people (Slack, email, webhook) when an open alert "
        "has been idle this long, JSON or comma list: 60,105",
    )
    class_remind_minutes: dict[WorkloadClass, list[Annotated[int, Field(ge=1, le=7 * 1440)]]] = (
        Field(default_factory=dict, description='per class, JSON: {"interactive": [30, 60]}')
    )
    exempt: list[IdleExemption] = Field(
        default_factory=list,
        max_length=1000,
        description="allocations that open no idle alert, JSON: "
        '[{"workload_class": "interactive", "younger_than_minutes": 30}, '
        '{"namespace": "debug-*"}]',
    )

    rules: list[IdleRule] = Field(
        default_factory=list,
        max_length=1000,
        description="per cluster, namespace, partition, user, labels..., first match wins, "
        'JSON: [{"partition": "debug", "minutes": 30}, '
        '{"labels": {"gpugap.io/idle": "relaxed"}, "threshold": 0.01}]',
    )

    _remind = field_validator("remind_minutes", mode="before")(comma_list)

    def reminders(self) -> dict[str, tuple[int, ...]]:
        """The idle minutes at which a person is reminded, per class and for '' (no class)."""
        out = {"": tuple(sorted(set(self.remind_minutes)))}
        for w in WorkloadClass:
            out[w.value] = tuple(sorted(set(self.class_remind_minutes.get(w, self.remind_minutes))))
        return out

    def policy(self) -> dict[str, tuple[float, int]]:
        """(threshold, minutes) for each class, and for '' (no class)."""
        out = {"": (self.threshold, self.minutes)}
        for w in WorkloadClass:
            out[w.value] = (
                self.class_thresholds.get(w, self.threshold),
                self.class_minutes.get(w, self.minutes),
            )
        return out


class Settings(BaseSettings):
    model_config = env_config("GPUGAP_")

    cluster: str = Field(default="default", description="cluster name stamped on produced records")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    services: ServicesSettings = Field(default_factory=ServicesSettings)
    idle: IdleSettings = Field(default_factory=IdleSettings)

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
        "idle": IdleSettings,
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


def read_part(cls: type[PartT]) -> PartT:
    """One part's settings from the environment (a part's own class, beside its code), every
    validation problem one line of a ConfigError naming the variable, as ``load`` does."""
    from pydantic import ValidationError

    try:
        return cls()
    except ValidationError as exc:
        lines = _describe(exc, str(cls.model_config.get("env_prefix", "")))
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None


def _describe(exc: Any, prefix: str) -> list[str]:
    return [f"  {prefix}{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()]
