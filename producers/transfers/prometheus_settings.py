"""``GPUGAP_TRANSFERS_PROMETHEUS_*``: the node-interface source's settings (Prometheus holding
node_exporter's ``node_network_{transmit,receive}_bytes_total``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode

from gpugap.groundfloor.settings import env_config, read_secret

#: one PromQL label matcher: name, operator, double-quoted value (no braces, no commas inside
#: names): ``job="node"``, ``instance=~"hpc-.*"``
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
ENV = r"^[a-z0-9][a-z0-9_.-]*$"


def split_matchers(text: str) -> list[tuple[str, str, str]]:
    """``job="node", instance=~"a.*"`` -> [(name, op, value)...]; ValueError if not that."""
    out: list[tuple[str, str, str]] = []
    rest = text.strip()
    while rest:
        m = _MATCHER.match(rest)
        if m is None:
            raise ValueError(f'not a PromQL label matcher list: {text!r} (e.g. job="node")')
        out.append((m.group(1), m.group(2), m.group(3)))
        rest = rest[m.end() :]
        if rest.startswith(","):
            rest = rest[1:]
        elif rest:
            raise ValueError(f"matchers are separated by commas: {text!r}")
    return out


class Link(BaseModel):
    """A boundary crossing in one cluster: node_exporter series of the interfaces ``device``
    matches on the nodes ``node`` matches (and ``matchers``, if any). Transmit on them is
    bytes from ``from_env`` to ``to_env``; receive is the other way."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster: str = Field(min_length=1, max_length=253, pattern=r"^[^/\s][^/]*$")
    device: str = Field(min_length=1, max_length=512, description="regex on the device label")
    node: str = Field(default=".+", min_length=1, max_length=512, description="regex on the node")
    node_label: str = Field(
        default="instance",
        pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$",
        description="the label naming the node ('instance': its ':port' is dropped)",
    )
    matchers: str = Field(default="", max_length=2048, description='more: job="node",...')
    from_env: str = Field(min_length=1, max_length=64, pattern=ENV)
    to_env: str = Field(min_length=1, max_length=64, pattern=ENV)

    @field_validator("device", "node")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {value!r} ({exc})") from None
        if '"' in value:
            raise ValueError("a regex here cannot contain a double quote")
        return value

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, value: str) -> str:
        split_matchers(value)
        return value

    @model_validator(mode="after")
    def _two_sides(self) -> Self:
        if self.from_env == self.to_env:
            raise ValueError("from_env and to_env must differ (a link crosses a boundary)")
        return self

    def selector(self, metric: str) -> str:
        """The PromQL series selector of this link's ``metric``."""

        def quote(regex: str) -> str:
            return regex.replace("\\", "\\\\")

        parts = [f'device=~"{quote(self.device)}"', f'{self.node_label}=~"{quote(self.node_re())}"']
        parts += [f'{n}{op}"{v}"' for n, op, v in split_matchers(self.matchers)]
        return f"{metric}{{{','.join(parts)}}}"

    def node_re(self) -> str:
        # instance is host:port: the node regex matches the host, any port (or none)
        return f"(?:{self.node})(?::[0-9]+)?" if self.node_label == "instance" else self.node


def _links(value: Any) -> Any:
    if isinstance(value, str):
        return json.loads(value) if value.strip() else []
    return value


class TransfersPrometheusSettings(BaseSettings):
    """The node-interface source (``gpugap produce transfers-prometheus``)."""

    model_config = env_config("GPUGAP_TRANSFERS_PROMETHEUS_")

    url: str | None = Field(default=None, description="Prometheus, e.g. http://prometheus:9090")
    bearer_token: SecretStr | None = Field(default=None, description="Authorization: Bearer")
    bearer_token_file: Path | None = None
    links: Annotated[list[Link], NoDecode] = Field(
        default_factory=list,
        max_length=256,
        description='JSON: [{"cluster": "hpc", "node": "hpc-.*", "device": "bond0", '
        '"from_env": "onprem", "to_env": "cloud"}] (transmit = from -> to)',
    )
    links_file: Path | None = Field(default=None, description="the links as a JSON file")
    since: str | None = Field(default=None, description="ISO-8601 or relative (-24h)")
    until: str | None = Field(default=None, description="default now")
    step_s: int = Field(
        default=60, ge=1, le=86_400, description="one transfer per node/interface/step"
    )
    points_per_query: int = Field(
        default=10_000, ge=2, le=11_000, description="steps per query_range (Prometheus: 11,000)"
    )
    max_series: int = Field(default=10_000, ge=1, description="per query; more is an error")
    max_points: int = Field(default=50_000_000, ge=1, description="per run, all series")
    timeout_s: float = Field(default=60.0, gt=0, description="per request")
    max_response_bytes: int = Field(default=256 << 20, gt=0, description="larger is refused")
    retries: int = Field(default=2, ge=0, le=10, description="a failed request, again")

    _links_json = field_validator("links", mode="before")(_links)

    @model_validator(mode="after")
    def _files(self) -> Self:
        token = read_secret(self.bearer_token, self.bearer_token_file, "the Prometheus token")
        object.__setattr__(self, "bearer_token", token)
        if not self.links and self.links_file is not None:
            try:
                raw = json.loads(self.links_file.read_text())
            except OSError as exc:
                raise ValueError(f"cannot read {self.links_file}: {exc.strerror}") from None
            object.__setattr__(self, "links", [Link.model_validate(x) for x in raw])
        return self
