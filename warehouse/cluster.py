"""The migrations for a ClickHouse cluster: every table as a Replicated* table on each shard
(``<name>_local``) behind a Distributed table of the original name, every view and change
``ON CLUSTER``, so the sink, the report and every view keep using the names they use on one
server (``gpugap db migrate --cluster NAME`` prints it for a person to review and apply).

Rows a ReplacingMergeTree or AggregatingMergeTree must merge share their sorting key; the
sharding key hashes that key, so they always land on one shard and ``FINAL`` stays exact per
shard. Views read Distributed tables and join them to subqueries of Distributed tables, which
ClickHouse refuses by default: the profile that runs them needs ``distributed_product_mode =
'global'`` (docs/warehouse.md). Only parsed by the engine here, never run on a cluster.

The input is the project's own migrations (trusted text, not requests or records).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpugap.groundfloor.sqllex import mask
from gpugap.warehouse.migrate import Migration

_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.IGNORECASE)
_ENGINE = re.compile(r"\bENGINE\s*=\s*(\w*MergeTree)\s*(\(([^()]*)\))?", re.IGNORECASE)
_ORDER_BY = re.compile(
    r"\bORDER\s+BY\s+(.+?)\s*(?:\b(?:PRIMARY\s+KEY|SAMPLE\s+BY|TTL|SETTINGS)\b|$)",
    re.IGNORECASE | re.DOTALL,
)
_VIEW = re.compile(r"^\s*CREATE\s+(OR\s+REPLACE\s+)?VIEW\s+(\w+)\s+AS\b", re.IGNORECASE)
_ALTER = re.compile(r"^\s*ALTER\s+TABLE\s+(\w+)\b", re.IGNORECASE)
_CLUSTER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def cluster_statements(migrations: Iterable[Migration], cluster: str) -> list[str]:
    """Each migration's statements for ``cluster``, in order."""
    if not _CLUSTER_NAME.match(cluster):
        raise ValueError(f"not a ClickHouse cluster name: {cluster!r}")
    out: list[str] = []
    for mig in migrations:
        out.append(f"-- {mig.version:03d}_{mig.name}")
        for statement in mig.statements():
            out += for_cluster(statement, cluster)
    return out


def for_cluster(statement: str, cluster: str) -> list[str]:
    masked = mask(statement)
    if m := _CREATE_TABLE.match(masked):
        return _table(statement, masked, m.group(1), cluster)
    if m := _VIEW.match(masked):
        head = (
            f"CREATE {'OR REPLACE ' if m.group(1) else ''}VIEW {m.group(2)} ON CLUSTER {cluster} AS"
        )
        return [head + statement[m.end() :]]
    if m := _ALTER.match(masked):
        rest = statement[m.end() :]
        name = m.group(1)
        # the Distributed table carries the columns too (it reads them by name)
        return [
            f"ALTER TABLE {name}_local ON CLUSTER {cluster}{rest}",
            f"ALTER TABLE {name} ON CLUSTER {cluster}{rest}",
        ]
    return [statement]  # INSERT ... SELECT: through the Distributed table, as on one server


def _table(statement: str, masked: str, name: str, cluster: str) -> list[str]:
    engine = _ENGINE.search(masked)
    order = _ORDER_BY.search(masked, engine.end() if engine else 0)
    if engine is None or order is None:
        raise ValueError(f"table {name}: no MergeTree engine and ORDER BY to replicate")
    args = (engine.group(3) or "").strip()
    path = f"'/clickhouse/tables/{{shard}}/{{database}}/{name}_local', '{{replica}}'"
    replicated = f"ENGINE = Replicated{engine.group(1)}({path}{', ' + args if args else ''})"
    header = _CREATE_TABLE.match(masked)
    assert header is not None
    local = (
        f"CREATE TABLE IF NOT EXISTS {name}_local ON CLUSTER {cluster}"
        + statement[header.end() : engine.start()]
        + replicated
        + statement[engine.end() :]
    )
    key = statement[order.start(1) : order.end(1)].strip()
    key = key[1:-1] if key.startswith("(") and key.endswith(")") else key
    distributed = (
        f"CREATE TABLE IF NOT EXISTS {name} ON CLUSTER {cluster} AS {name}_local "
        f"ENGINE = Distributed({cluster}, currentDatabase(), {name}_local, cityHash64({key}))"
    )
    return [local, distributed]
