"""What one request, one user and the endpoint may consume: the limits of the embedded
endpoint (``GPUGAP_CLICKHOUSE_SERVE_*``), which engine_config.py gives the engine to enforce
and the endpoint enforces around it, and the machine's memory they are shares of."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

GiB = 1 << 30


class EndpointLimits(BaseSettings):
    """``GPUGAP_CLICKHOUSE_SERVE_*``: bounds of the embedded endpoint, per request."""

    model_config = SettingsConfigDict(
        env_prefix="GPUGAP_CLICKHOUSE_SERVE_", frozen=True, extra="ignore"
    )

    max_query_bytes: int = Field(
        default=256 * 1024,
        gt=0,
        description="query text (URL + body of a non-INSERT), like max_query_size",
    )
    max_uri_bytes: int = Field(
        default=1 << 20, gt=0, description="request line, like http_max_uri_size"
    )
    max_form_bytes: int = Field(
        default=16 << 20,
        gt=0,
        description="a multipart/form-data body (a query and its parameters as form fields, as "
        "clickhouse-connect sends them past 4 KiB), read whole; each field's name and value is "
        "also bounded by MAX_URI_BYTES, like one URL parameter",
    )
    max_form_fields: int = Field(
        default=10_000, gt=0, description="the parts of a multipart/form-data body"
    )
    max_insert_bytes: int = Field(
        default=4 * GiB,
        gt=0,
        description="one INSERT's data after decompression (streamed, except the whole-file "
        "formats such as Parquet and ORC, which chDB buffers)",
    )
    max_line_bytes: int = Field(
        default=16 << 20,
        ge=2 << 20,
        description="one line of a text INSERT format (CSV, TSV, JSONEachRow, Values...): chDB "
        "buffers a row that never ends",
    )
    receive_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="headers, and each read of a body, like http_receive_timeout",
    )
    max_execution_time_s: int = Field(
        default=300, gt=0, description="default and maximum per query"
    )
    max_memory_usage: int = Field(
        default=4 * GiB, gt=0, description="default and maximum per query"
    )
    max_result_bytes: int = Field(
        default=1 * GiB,
        gt=0,
        description="the bytes one answer may send (it is buffered before it is sent)",
    )
    max_pending_bytes_for_user: int = Field(
        default=1 * GiB,
        gt=0,
        description="the bytes of one user's answers waiting to be sent at once (at least "
        "MAX_RESULT_BYTES); a request that would pass it waits QUEUE_WAIT_S, then gets code 241",
    )
    send_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="how long a client may take to accept the next piece of an answer, like "
        "http_send_timeout; then the connection is closed and its slot freed",
    )
    max_server_memory_usage: int = Field(
        default=0,
        ge=0,
        description="the engine's memory (0: 80 % of the machine's, or of its cgroup's limit)",
    )
    max_memory_usage_for_user: int = Field(
        default=0,
        ge=0,
        description="the memory one user's queries may hold together, enforced by the engine's "
        "workloads (0: the server's memory shared equally among the users)",
    )
    max_concurrent_queries: int = Field(default=16, gt=0)
    max_concurrent_queries_for_user: int = Field(
        default=0,
        ge=0,
        description="queries one user may run at once (0: the slots shared out equally among "
        "the users, so no user waits behind another)",
    )
    queue_wait_s: float = Field(
        default=10.0, ge=0, description="how long a request waits for a free slot before code 202"
    )
    max_sessions: int = Field(default=100, gt=0, description="sessions kept per user")
    session_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="idle time before a session ends, and the most a session_timeout may ask",
    )
    allowed_hosts: str = Field(
        default="",
        description="comma-separated Host names the endpoint answers besides its listen "
        "address and the loopback names (a web page cannot reach it through DNS rebinding)",
    )
    allowed_origins: str = Field(
        default="",
        description="comma-separated web origins (scheme://host:port) whose pages may send it "
        "requests; its own pages always may",
    )

    confine: Literal["required", "best-effort", "off"] = Field(
        default="required",
        description="the engine process's confinement "
        "(docs/security.md#confinement-the-operating-system-is-the-boundary): "
        "required (it does not start unconfined), best-effort (what the kernel allows, the rest "
        "logged) or off",
    )

    @model_validator(mode="after")
    def _pending_holds_an_answer(self) -> EndpointLimits:
        if self.max_pending_bytes_for_user < self.max_result_bytes:
            raise ValueError(
                "GPUGAP_CLICKHOUSE_SERVE_MAX_PENDING_BYTES_FOR_USER must be at least "
                "MAX_RESULT_BYTES (one answer must fit)"
            )
        return self

    def server_memory(self) -> int:
        return self.max_server_memory_usage or int(machine_memory() * 0.8)

    def user_memory(self, users: int) -> int:
        return self.max_memory_usage_for_user or self.server_memory() // max(1, users)

    def names(self, field: str) -> frozenset[str]:
        value = getattr(self, field)
        return frozenset(v.strip().lower().rstrip("/") for v in value.split(",") if v.strip())


def machine_memory() -> int:
    """This machine's memory, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total
