"""``gpugap produce transfers-csv``: cloud billing egress lines (CSV) as ``transfers.v1``.

Each row is one transfer: an amount (bytes, or the unit given), a time, the two environments
and, where the bill says, a team, an owner, the cost billed. The header names are
configurable (``GPUGAP_TRANSFERS_COLUMNS``), so an AWS Cost and Usage Report or a GCP billing
export maps onto the same fields.

Idempotent: a row's event id is its ``id`` column (AWS ``identity/LineItemId``), else a
digest of the cluster and the row's values (the n-th identical row gets ``-n``), so
importing the same file again produces the same records, which the warehouse collapses.
A bad row is reported on stderr with its line number and skipped; nothing else stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import hashlib
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, ClassVar

from pydantic import ValidationError

from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import Producer
from gpugap.schemas import Topic
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.models import Transfer
from gpugap.schemas.topics import TRANSFERS

from .settings import TransfersCsvSettings

UNITS = {
    "bytes": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
MAX_REPORTED = 100
DEFAULT_CLUSTER = "default"  # GPUGAP_CLUSTER's when unset
SOURCE = "billing_csv"


@dataclass(frozen=True)
class BadRow:
    line: int
    reason: str


def parse_time(text: str) -> datetime:
    """ISO-8601 (no offset = UTC) or seconds since the epoch."""
    text = text.strip()
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        pass
    t = datetime.fromisoformat(text)
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


#: what a bill's decimal-looking units mean where it says GB for GiB (``binary_units``)
BINARY = {"kb": "kib", "mb": "mib", "gb": "gib", "tb": "tib"}


def _bytes(amount: str, unit: str, binary: bool = False) -> int:
    name = unit.strip().lower()
    factor = UNITS.get(BINARY.get(name, name) if binary else name)
    if factor is None:
        raise ValueError(f"unknown unit {unit!r} (known: {', '.join(UNITS)})")
    value = float(amount)
    if not value >= 0:  # also NaN
        raise ValueError(f"amount {amount!r}: a transfer moves a non-negative amount")
    return round(value * factor)


def rows(fh: Iterable[str], cfg: TransfersCsvSettings, cluster: str) -> Iterator[Transfer | BadRow]:
    """The transfers of one CSV (a header line first), and what was wrong with the rest."""
    col = cfg.header_of()
    reader = csv.DictReader(fh)
    header = reader.fieldnames or []
    if col["amount"] not in header or col["time"] not in header:
        yield BadRow(1, f"the header needs {col['amount']!r} and {col['time']!r}: has {header}")
        return
    seen: Counter[str] = Counter()
    for n, row in enumerate(reader):
        line = reader.line_num
        if n >= cfg.max_rows:
            yield BadRow(line, f"more than {cfg.max_rows} rows (GPUGAP_TRANSFERS_MAX_ROWS)")
            return

        def get(field: str, row: dict[str, Any] = row) -> str | None:
            value = row.get(col[field])
            return value.strip() if isinstance(value, str) and value.strip() else None

        try:
            where = get("cluster") or cluster
            record_id = get("event_id")
            if record_id is None:
                values = "\x1f".join(f"{k}={row[k]}" for k in sorted(header) if k in row)
                digest = hashlib.sha256(f"{where}\x1e{values}".encode()).hexdigest()[:32]
                seen[digest] += 1
                record_id = f"csv-{digest}" + (f"-{seen[digest]}" if seen[digest] > 1 else "")
            src, dst = get("from_env") or cfg.from_env, get("to_env") or cfg.to_env
            if src is None or dst is None:
                raise ValueError("no from/to environment (a column, or --from-env/--to-env)")
            cost = get("billed_cost")
            yield Transfer(
                event_id=record_id,
                time=parse_time(get("time") or ""),
                interval_s=float(get("interval_s") or 0.0),
                cluster=where,
                from_env=src.lower(),
                to_env=dst.lower(),
                bytes=_bytes(get("amount") or "", get("unit") or cfg.unit, cfg.binary_units),
                source=SOURCE,
                node=get("node"),
                team=get("team"),
                owner=get("owner"),
                allocation_id=get("allocation_id"),
                description=get("description"),
                billed_cost=float(cost) if cost is not None else None,
                billed_currency=(get("billed_currency") or "").upper() or None,
            )
        except ValidationError as exc:
            e = exc.errors()[0]
            yield BadRow(line, f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}")
        except (ValueError, OverflowError) as exc:
            yield BadRow(line, str(exc))


class TransfersCsv(Producer):
    name: ClassVar[str] = "transfers-csv"

    def __init__(
        self,
        settings: Settings,
        config: TransfersCsvSettings | None = None,
        errors: IO[str] | None = None,
    ) -> None:
        super().__init__(settings, config)
        self.config = config or TransfersCsvSettings()
        if not self.config.files:
            raise ConfigError("transfers-csv: no file (--file FILE or GPUGAP_TRANSFERS_FILES)")
        self.cluster = self.config.cluster or settings.cluster
        self.errors = errors or sys.stderr
        self.imported = self.bad = 0
        if self.cluster == DEFAULT_CLUSTER and "cluster" not in self.config.columns:
            # rows land in a cluster no rate card names: imported, and priced at no rate
            print(
                f"transfers-csv: rows without a cluster column go to cluster {self.cluster!r}; "
                "name the cluster the bill is for with --cluster (GPUGAP_TRANSFERS_CLUSTER or "
                "GPUGAP_CLUSTER), the rate card's name for it, or its egress has no rate",
                file=self.errors,
            )

    @classmethod
    def default_topic(cls) -> Topic[Any]:
        return TRANSFERS

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        for path in self.config.files:
            with contextlib.ExitStack() as stack:
                try:
                    fh = (
                        sys.stdin
                        if path == "-"
                        else stack.enter_context(open(path, newline="", encoding="utf-8-sig"))
                    )
                except OSError as exc:
                    raise ConfigError(
                        f"transfers-csv: cannot read {path}: {exc.strerror}"
                    ) from None
                for n, item in enumerate(rows(fh, self.config, self.cluster)):
                    if stop.is_set():
                        return
                    if n % 256 == 255:
                        await asyncio.sleep(0)  # let the Kafka client's tasks and signals in
                    if isinstance(item, BadRow):
                        self._bad(path, item)
                    else:
                        await self.emit(item)
                        self.imported += 1

    def _bad(self, path: str, item: BadRow) -> None:
        self.bad += 1
        if self.bad <= MAX_REPORTED:
            print(
                f"transfers-csv: {path} line {item.line}: {item.reason} (skipped)", file=self.errors
            )
        elif self.bad == MAX_REPORTED + 1:
            print("transfers-csv: further bad rows are counted, not shown", file=self.errors)
