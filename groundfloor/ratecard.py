"""The rate card: what a GPU-hour, a kWh and a GiB across the boundary cost, per cluster.

Configured with ``GPUGAP_COST_RATE_CARD`` (JSON) or ``GPUGAP_COST_RATE_CARD_FILE`` (YAML or
JSON), validated here, and written by the sink (at start) or ``gpugap cost load`` into the
warehouse's ``rate_card`` and ``transfer_rate`` tables (migration 008), flattened to one row
per node rule. The views apply the latest card written on top of the GPU-hour tables; the
capacity numbers never change. Definitions: docs/cost.md.

Where the GPU model comes from: the GPU-minute tables carry no model (a GpuMinute names its
GPU by UUID), so a card maps each cluster to a default model and, optionally, node name
patterns (shell style, first match wins) to other models. MIG slices (``MIG-`` UUIDs) are
charged a share of their parent: ``mig_share`` or ``mig_profile`` (``3g.40gb`` = 3/7) on the
rule or the cluster; a MIG slice with neither has no rate.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import env_config
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.shares import mig_share

HOURS_PER_YEAR = 8760.0
Money = Annotated[float, Field(ge=0.0, le=1e9)]
Env = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]*$")]


def mig_share_of(profile: str) -> float:
    """A MIG profile's share of its parent GPU by compute slices: ``3g.40gb`` -> 3/7 (the
    stream's own rule, schemas.shares; the card says no GPU model: 7 slices)."""
    share = mig_share(profile)
    if share is None:
        raise ValueError(f"MIG profile {profile!r}: expected '<N>g.<memory>gb', e.g. '3g.40gb'")
    return share


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CloudRate(_Model):
    """Cloud price of one GPU for one hour (the instance price divided by its GPUs)."""

    on_demand: Money | None = None
    reserved: Money | None = None


class Capital(_Model):
    """An on-prem GPU's capital, amortised straight-line: (price - residual) / years."""

    price: Money
    years: float = Field(gt=0.0, le=30.0)
    residual: Money = 0.0

    @model_validator(mode="after")
    def _residual(self) -> Self:
        if self.residual > self.price:
            raise ValueError("residual cannot exceed price")
        return self

    def per_gpu_hour(self) -> float:
        return (self.price - self.residual) / (self.years * HOURS_PER_YEAR)


class _MigShare(_Model):
    mig_share: float | None = Field(default=None, gt=0.0, le=1.0)
    mig_profile: str | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _profile(self) -> Self:
        if self.mig_profile is not None:
            share = mig_share_of(self.mig_profile)
            if self.mig_share is None:
                object.__setattr__(self, "mig_share", share)
        return self


class NodeRule(_MigShare):
    """Nodes whose name matches ``pattern`` (``*``, ``?``): their GPU model, pricing, MIG share
    (what a rule leaves out is the cluster's)."""

    pattern: str = Field(min_length=1, max_length=253)
    gpu_model: str | None = Field(default=None, min_length=1, max_length=128)
    pricing: Literal["on_demand", "reserved"] | None = None


class ClusterCard(_MigShare):
    environment: Literal["cloud", "onprem"]
    gpu_model: str | None = Field(
        default=None, min_length=1, max_length=128, description="nodes no rule matches"
    )
    nodes: list[NodeRule] = Field(default_factory=list, max_length=1000)
    pricing: Literal["on_demand", "reserved"] = "on_demand"
    cloud: dict[str, CloudRate] = Field(default_factory=dict, max_length=1000)
    capital: dict[str, Capital] = Field(default_factory=dict, max_length=1000)
    overhead_per_gpu_hour: Money = 0.0
    kwh_price: Money | None = Field(default=None, description="on-prem: currency per kWh")
    pue: float = Field(default=1.0, ge=1.0, le=5.0)
    emission_g_per_kwh: float | None = Field(default=None, ge=0.0, le=5000.0)
    egress_per_gib: dict[str, Money] = Field(
        default_factory=dict, max_length=1000, description='per direction: {"cloud->onprem": 0.09}'
    )

    @model_validator(mode="after")
    def _priced(self) -> Self:
        if self.environment == "onprem" and self.kwh_price is None:
            raise ValueError("an onprem cluster needs kwh_price (the power it draws is paid)")
        for rule in self.nodes:
            model = rule.gpu_model or self.gpu_model
            if model is None:
                raise ValueError(f"node rule {rule.pattern!r}: no gpu_model (and no default)")
            self._rate(model, rule.pricing or self.pricing)
        if self.gpu_model is not None:
            self._rate(self.gpu_model, self.pricing)
        for key in self.egress_per_gib:
            _direction(key)
        return self

    def _rate(self, model: str, pricing: str) -> float:
        """Currency per GPU-hour before power: the cloud price, or capital + overhead."""
        if self.environment == "cloud":
            rate = self.cloud.get(model)
            value = None if rate is None else getattr(rate, pricing)
            if value is None:
                raise ValueError(f"gpu_model {model!r}: no {pricing} price under 'cloud'")
            return float(value)
        capital = self.capital.get(model)
        if capital is None:
            raise ValueError(f"gpu_model {model!r}: no entry under 'capital'")
        return capital.per_gpu_hour() + self.overhead_per_gpu_hour


def _direction(key: str) -> tuple[str, str]:
    src, sep, dst = key.partition("->")
    if not sep or not src.strip() or not dst.strip() or src.strip() == dst.strip():
        raise ValueError(f"egress direction {key!r}: expected 'from->to', e.g. 'cloud->onprem'")
    return src.strip(), dst.strip()


class RateCard(_Model):
    name: str = Field(default="", max_length=200, description="a label the report shows")
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    clusters: dict[
        Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^/\s][^/]*$")], ClusterCard
    ] = Field(default_factory=dict, max_length=1000)

    def card_id(self) -> str:
        """A digest of the card's content: the same card always has the same id."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]


RATE_COLUMNS = [
    "cluster",
    "priority",
    "node_pattern",
    "node_regex",
    "gpu_model",
    "environment",
    "pricing",
    "gpu_hour_rate",
    "capital_per_gpu_h",
    "overhead_per_gpu_h",
    "kwh_price",
    "pue",
    "emission_g_per_kwh",
    "mig_share",
    "currency",
    "card_id",
    "card_name",
    "source",
    "updated_at",
]
TRANSFER_RATE_COLUMNS = ["cluster", "from_env", "to_env", "per_gib", "currency", "updated_at"]


def glob_regex(pattern: str) -> str:
    """A shell pattern (``*``, ``?``) as an anchored RE2 regex (what ClickHouse's match uses)."""
    out = []
    for ch in pattern:
        out.append(".*" if ch == "*" else "." if ch == "?" else re.escape(ch))
    return "^" + "".join(out) + "$"


def rate_rows(card: RateCard, source: str, now: datetime) -> list[list[Any]]:
    """The ``rate_card`` rows: per cluster its node rules in order, then its default. A card
    without clusters is one marker row (cluster ''), so it still replaces the previous one."""
    rows: list[list[Any]] = []
    cid = card.card_id()
    for name, c in sorted(card.clusters.items()):
        rules = [(r.pattern, r.gpu_model or c.gpu_model, r.pricing, r.mig_share) for r in c.nodes]
        if c.gpu_model is not None:
            rules.append(("*", c.gpu_model, None, None))
        for priority, (pattern, model, pricing, share) in enumerate(rules):
            assert model is not None  # validated
            how = "capital" if c.environment == "onprem" else (pricing or c.pricing)
            capital = c.capital[model].per_gpu_hour() if c.environment == "onprem" else None
            rows.append(
                [
                    name,
                    priority,
                    pattern,
                    glob_regex(pattern),
                    model,
                    c.environment,
                    how,
                    c._rate(model, pricing or c.pricing),
                    capital,
                    c.overhead_per_gpu_hour if c.environment == "onprem" else 0.0,
                    # a cloud GPU-hour's price includes its power
                    c.kwh_price if c.environment == "onprem" else 0.0,
                    c.pue,
                    c.emission_g_per_kwh,
                    share if share is not None else c.mig_share,
                    card.currency,
                    cid,
                    card.name,
                    source,
                    now,
                ]
            )
    if not rows:
        rows.append(["", 0, "", "", "", "", "", 0.0, None, 0.0, 0.0, 1.0, None, None])
        rows[-1] += [card.currency, cid, card.name, source, now]
    return rows


def transfer_rate_rows(card: RateCard, now: datetime) -> list[list[Any]]:
    rows = []
    for name, c in sorted(card.clusters.items()):
        for key, per_gib in sorted(c.egress_per_gib.items()):
            src, dst = _direction(key)
            rows.append([name, src, dst, per_gib, card.currency, now])
    return rows


def write_rate_card(client: Any, card: RateCard, source: str, now: datetime | None = None) -> str:
    """Insert the card (a clickhouse-connect client): it becomes the latest, the one the
    views apply. Returns its id."""
    now = now or datetime.now(UTC)
    transfer = transfer_rate_rows(card, now)
    if transfer:  # first: a card is current once its rate_card rows are in
        client.insert("transfer_rate", transfer, column_names=TRANSFER_RATE_COLUMNS)
    client.insert("rate_card", rate_rows(card, source, now), column_names=RATE_COLUMNS)
    return card.card_id()


def parse_card(text: str, where: str, yaml_ok: bool) -> RateCard:
    """A card from JSON (or YAML when ``yaml_ok``), or a ConfigError naming the fields."""
    try:
        if yaml_ok:
            try:
                import yaml  # type: ignore[import-untyped]
            except ModuleNotFoundError:
                raise ConfigError(
                    f"{where}: a YAML rate card needs PyYAML (pip install pyyaml), or use JSON"
                ) from None
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError
        raise ConfigError(f"{where}: not valid JSON: {exc}") from None
    except Exception as exc:  # yaml.YAMLError
        if type(exc).__module__.startswith("yaml"):
            raise ConfigError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from None
        raise
    return validate_card(data, where)


def validate_card(data: object, where: str) -> RateCard:
    try:
        return RateCard.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or '(card)'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"invalid rate card ({where}):\n" + "\n".join(lines)) from None


class CostSettings(BaseSettings):
    """``GPUGAP_COST_*``: the rate card (docs/cost.md)."""

    model_config = env_config("GPUGAP_COST_")

    rate_card: str | None = Field(default=None, description="the rate card as JSON")
    rate_card_file: Path | None = Field(default=None, description="a YAML or JSON rate card")

    @model_validator(mode="after")
    def _one(self) -> Self:
        if self.rate_card is not None and self.rate_card_file is not None:
            raise ConfigError("set GPUGAP_COST_RATE_CARD or GPUGAP_COST_RATE_CARD_FILE, not both")
        return self

    def source(self) -> str | None:
        """Where the card comes from, as the report states it."""
        if self.rate_card_file is not None:
            return f"file {self.rate_card_file}"
        return "GPUGAP_COST_RATE_CARD" if self.rate_card is not None else None

    def card(self) -> RateCard | None:
        """The configured card (None: none configured), or a ConfigError saying what is wrong."""
        if self.rate_card is not None:
            return parse_card(self.rate_card, "GPUGAP_COST_RATE_CARD", yaml_ok=False)
        if self.rate_card_file is None:
            return None
        path = self.rate_card_file.expanduser()
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(
                f"cannot read GPUGAP_COST_RATE_CARD_FILE={path}: {exc.strerror or exc}"
            ) from None
        return parse_card(text, str(path), yaml_ok=path.suffix.lower() in (".yaml", ".yml"))


def configured_card() -> tuple[RateCard | None, str]:
    """(card, source) from the environment; (None, '') when no card is configured."""
    try:
        settings = CostSettings()
    except ValidationError as exc:
        lines = [
            f"  GPUGAP_COST_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}"
            for e in exc.errors()
        ]
        raise ConfigError("invalid cost configuration:\n" + "\n".join(lines)) from None
    return settings.card(), settings.source() or ""
