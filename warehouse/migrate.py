"""The warehouse's tables and views: the ``migrations/NNN_name.sql`` files, applied in order,
each once. Applied versions and their checksums are recorded in ``schema_migrations``. The same
files run on the embedded endpoint and on a real ClickHouse server."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.groundfloor.sqllex import mask
from gpugap.schemas.errors import ConfigError
from gpugap.warehouse.client import connect


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]

    def statements(self) -> list[str]:
        masked, out, start = mask(self.sql), [], 0
        for i, ch in enumerate(masked):
            if ch == ";":
                out.append(self.sql[start:i])
                start = i + 1
        out.append(self.sql[start:])
        return [s.strip() for s in out if mask(s).strip()]


def migrations() -> list[Migration]:
    found = []
    for entry in resources.files("gpugap.warehouse.migrations").iterdir():
        m = re.fullmatch(r"(\d+)_(\w+)\.sql", entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    return sorted(found, key=lambda mig: mig.version)


def migrate(settings: ClickHouseSettings) -> list[Migration]:
    """Apply the migrations not applied yet; returns those applied now."""
    admin = connect(settings, database=False)
    try:
        admin.command(f"CREATE DATABASE IF NOT EXISTS `{settings.database}`")
    finally:
        admin.close()
    client = connect(settings)
    try:
        client.command(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version UInt32, name String, "
            "checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
            "ENGINE = ReplacingMergeTree ORDER BY version"
        )
        applied = dict(
            client.query("SELECT version, checksum FROM schema_migrations FINAL").result_rows
        )
        done = []
        for mig in migrations():
            if mig.version in applied:
                if applied[mig.version] != mig.checksum:
                    raise ConfigError(
                        f"migration {mig.version:03d}_{mig.name} changed after it was applied "
                        "(checksum differs): add a new migration instead of editing it"
                    )
                continue
            for statement in mig.statements():
                client.command(statement)
            client.insert(
                "schema_migrations",
                [[mig.version, mig.name, mig.checksum]],
                column_names=["version", "name", "checksum"],
            )
            done.append(mig)
        return done
    finally:
        client.close()
