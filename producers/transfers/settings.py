"""``GPUGAP_TRANSFERS_*``: the billing CSV import's settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from gpugap.groundfloor.settings import CommaList, comma_list, env_config

#: record field -> the CSV header that holds it, unless GPUGAP_TRANSFERS_COLUMNS says otherwise
DEFAULT_COLUMNS = {
    "event_id": "id",
    "time": "time",
    "interval_s": "interval_s",
    "amount": "bytes",
    "unit": "unit",
    "cluster": "cluster",
    "from_env": "from",
    "to_env": "to",
    "team": "team",
    "owner": "owner",
    "allocation_id": "allocation_id",
    "node": "node",
    "description": "description",
    "billed_cost": "cost",
    "billed_currency": "currency",
}
Unit = Literal["bytes", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"]


class TransfersCsvSettings(BaseSettings):
    """The billing CSV import (``gpugap produce transfers-csv --file FILE``)."""

    model_config = env_config("GPUGAP_TRANSFERS_")

    files: CommaList = Field(default_factory=list, description="CSV files ('-' = stdin)")
    cluster: str | None = Field(
        default=None, description="rows without a cluster column (default GPUGAP_CLUSTER)"
    )
    from_env: str | None = Field(default=None, description="rows without a 'from' column")
    to_env: str | None = Field(default=None, description="rows without a 'to' column")
    unit: Unit = Field(
        default="bytes", description="unit of the amount where no unit column says (AWS: GiB)"
    )
    binary_units: bool = Field(
        default=False,
        description="read KB, MB, GB, TB as 2^10, 2^20, 2^30, 2^40 bytes: cloud bills write "
        "'GB' for GiB (AWS's Cost and Usage Report, Azure); else they are 10^3..10^12",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        max_length=32,
        description='header names, JSON: {"time": "lineItem/UsageStartDate", '
        '"amount": "lineItem/UsageAmount", "event_id": "identity/LineItemId"}',
    )
    max_rows: int = Field(default=10_000_000, ge=1, description="per file; more is an error")

    _lists = field_validator("files", mode="before")(comma_list)

    @field_validator("columns")
    @classmethod
    def _known(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(DEFAULT_COLUMNS))
        if unknown:
            raise ValueError(f"unknown fields {unknown}: known are {sorted(DEFAULT_COLUMNS)}")
        return value

    def header_of(self) -> dict[str, str]:
        return {**DEFAULT_COLUMNS, **self.columns}
