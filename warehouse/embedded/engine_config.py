"""The engine's own configuration, which enforces the endpoint's limits (limits.py).

The engine (chDB) reads a ClickHouse ``config.xml`` + ``users.xml`` written here: the settings
profile carries the default limits with constraints (a client cannot raise them, not even in a
query's SETTINGS clause), and the grants leave out every host source (URL, S3, remote servers,
the File engine, reading or writing files, SYSTEM commands); ``default`` is a plain Atomic
database, not chDB's overlay that reads files named as tables. The scalar ``file()``, which
chDB checks against no grant, is refused by the HTTP layer (policy.py). All connections of the
process are the engine's user ``default``: who may write is decided per connection with
engine-level ``readonly``, and row policies on the system tables that hold query text key on
each connection's role.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from gpugap.schemas.errors import ServiceError
from gpugap.warehouse.embedded import policy, scopes
from gpugap.warehouse.embedded.limits import EndpointLimits

_CATALOG = """
import chdb
c = chdb.connect(":memory:")
q = lambda sql: c._conn.query(sql, "TSVRaw").bytes().decode().split()
print(" ".join(q("SELECT name FROM system.settings WHERE changed")))
print(" ".join(q("SELECT name FROM system.settings")))
"""


@dataclass(frozen=True)
class Catalog:
    """The engine's setting names, and those chDB itself changes on every connection."""

    names: frozenset[str]
    preset: frozenset[str]


def catalog(directory: Path) -> Catalog:
    """Read once per chDB version (in a child process: one engine per process, and this one
    must open the data directory with the configuration built from it), then cached."""
    # (the version from the package's metadata: importing chDB would load the engine, half a
    # gigabyte and a dozen threads, into the endpoint's own process)
    cache = directory / f"settings-{importlib.metadata.version('chdb')}.txt"
    if not cache.exists():
        directory.mkdir(parents=True, exist_ok=True)
        try:
            out = subprocess.run(
                [sys.executable, "-c", _CATALOG],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            ).stdout
        except (subprocess.SubprocessError, OSError) as exc:
            raise ServiceError(f"cannot list the engine's settings: {exc}") from None
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")  # endpoints may start side by side
        tmp.write_text(out)
        tmp.replace(cache)
    preset, names = [*cache.read_text().splitlines(), "", ""][:2]
    return Catalog(frozenset(names.split()), frozenset(preset.split()))


def write_engine_config(
    directory: Path,
    limits: EndpointLimits,
    cache: Path | None = None,
    *,
    guarded: bool = True,
    warehouse: str | None = None,
) -> Path:
    """Write config.xml and users.xml into ``directory`` (inside the data directory, the one
    place the engine process can read); return the config's path. The engine's setting names
    are read once per chDB version into ``cache`` (default: ``directory``), so a fresh data
    directory does not start a child process again. ``guarded=False`` (a test of the
    confinement, nothing else) leaves out every grant, constraint and row policy. The tables
    of the ``warehouse`` database get the scopes' row policies (scopes.POLICIES)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    known = catalog(cache or directory)
    capped = {
        "max_execution_time": limits.max_execution_time_s,
        "max_memory_usage": limits.max_memory_usage,
        "max_result_bytes": limits.max_result_bytes,
        "max_query_size": limits.max_query_bytes,
    }
    defaults = "".join(f"<{k}>{v}</{k}>" for k, v in {**capped, **FORCED}.items())
    # min 1: 0 means "no limit" to the engine
    maxima = "".join(f"<{k}><min>1</min><max>{v}</max></{k}>" for k, v in capped.items())
    maxima += f"<max_threads><max>{MAX_THREADS}</max></max_threads>"
    # the allow-list, enforced by the engine: every other setting is constant (clients see it
    # as readonly in system.settings), and so are those that switch a limit or a guard off.
    # Left changeable: readonly (a reader's connection sets it), log_comment (marks a
    # request's query for cancelling) and what chDB itself sets on every connection.
    fixed = {n for n in known.names if not policy.is_allowed(n)} | {
        "allow_ddl",
        "timeout_overflow_mode",
        "max_concurrent_queries_for_user",
        "max_concurrent_queries_for_all_users",
    }
    fixed -= {"readonly", *known.preset, *capped, *PER_REQUEST}
    const = "".join(f"<{k}><const/></{k}>" for k in sorted(fixed))
    grants = "".join(
        f"<query>{escape(g)}</query>"
        for g in (
            # no READ ON FILE: with an Atomic default database, chDB's INSERT needs no FILE
            # source, and without it the engine refuses file(), the File engine and tables
            # named by a path (``SELECT * FROM `/etc/passwd```) for every connection
            "GRANT SHOW, SELECT, INSERT, ALTER, CREATE, DROP, TRUNCATE, OPTIMIZE, "
            "KILL QUERY ON *.*",
        )
    )
    policies = "<system>" + _filters(ROW_POLICIES) + "</system>"
    if warehouse and warehouse != "system":
        policies += f"<{_element(warehouse)}>{_filters(scopes.POLICIES)}</{_element(warehouse)}>"
    if not guarded:
        defaults, const, maxima = "".join(f"<{k}>{v}</{k}>" for k, v in capped.items()), "", ""
    users = directory / "users.xml"
    users.write_text(
        "<clickhouse><profiles><default>"
        f"{defaults}<result_overflow_mode>throw</result_overflow_mode>"
        f"<constraints>{maxima}{const}</constraints>"
        "</default></profiles><users><default><password></password><profile>default</profile>"
        "<networks><ip>::/0</ip></networks><quota>default</quota>"
        + (f"<grants>{grants}</grants><databases>{policies}</databases>"
           if guarded else "")
        + "</default></users><quotas><default></default></quotas></clickhouse>\n"
    )  # fmt: skip
    # what the engine would otherwise keep elsewhere on the host stays in its data directory
    data = directory.parent.resolve()
    places = "".join(f"<{k}>{escape(str(data / v))}/</{k}>" for k, v in INSIDE.items())
    config = directory / "config.xml"
    default_database = (
        f"<default_database>{HOST_FILES_DATABASE}</default_database>" if guarded else ""
    )
    memory = (
        f"<max_server_memory_usage>{limits.server_memory()}</max_server_memory_usage>"
        # a query naming a workload nobody made is refused, not run unscheduled
        "<throw_on_unknown_workload>1</throw_on_unknown_workload>"
    )
    config.write_text(
        f"<clickhouse><users_config>{escape(str(users))}</users_config>{places}{memory}"
        f"{default_database}</clickhouse>\n"
    )
    return config


# settings whose value is the endpoint's, for every user: off the allowed list, so constant,
# but for those the endpoint itself sets per request (PER_REQUEST; the policy refuses them in
# a query's SETTINGS clause, and a reader's engine readonly refuses every setting change)
FORCED = {
    # Values data is data: an expression in it (``(file('/etc/passwd'))``) is refused, never
    # run, but in a writer's INSERT ... VALUES (execute.VALUES_EXPRESSIONS)
    "input_format_values_interpret_expressions": 0,
    "input_format_values_deduce_templates_of_expressions": 0,
    "send_logs_level": "fatal",
}
PER_REQUEST = frozenset(
    {
        "input_format_values_interpret_expressions",
        "input_format_values_deduce_templates_of_expressions",
        "log_comment",  # the request's role marker (ROW_POLICIES)
        "workload",  # the role's share of memory (workloads())
    }
)
# a client may use a few threads more than the machine has cores, as with a server, but not
# thousands (they would take the machine from everyone)
MAX_THREADS = max(16, 2 * (os.cpu_count() or 1))
# the engine's own directories, inside its data directory
INSIDE = {
    "tmp_path": "tmp",
    "user_files_path": "user_files",
    "user_scripts_path": "user_scripts",
    "format_schema_path": "format_schemas",
    "dictionaries_lib_path": "dictionaries_lib",
    "user_defined_path": "user_defined",
}


# chDB makes its configured default database an overlay that reads any host file named as a
# table. That overlay is given this name (nothing uses it, and without READ ON FILE the engine
# refuses what it would read), and ``default`` is a plain Atomic database (prepare_data_dir).
HOST_FILES_DATABASE = "_gpugap_host_files_off"
# Every engine connection is the engine's one user; each request's connection carries
# log_comment 'gpugap:<role>:<id>' (set before readonly, so a reader cannot change it). These
# engine row policies let a reader see only the reader's own running queries and no other
# query text; the endpoint's own connections (no log_comment) and the admin see all.
_ROLE = "splitByChar(':', getSetting('log_comment'))[2]"
# A reader scoped to a team or a person (scopes.py) sees only its own running query.
ROW_POLICIES = {
    "processes": f"{_ROLE} != 'reader' OR (({scopes.UNSCOPED}) AND "
    "splitByChar(':', Settings['log_comment'])[2] = 'reader') "
    "OR Settings['log_comment'] = getSetting('log_comment')",
    "query_cache": f"{_ROLE} != 'reader'",
    "asynchronous_inserts": f"{_ROLE} != 'reader'",
    # every thread's stack and query id, the server's own directories and paths
    "stack_trace": f"{_ROLE} != 'reader'",
    "disks": f"{_ROLE} != 'reader'",
    "user_directories": f"{_ROLE} != 'reader'",
    "server_settings": f"{_ROLE} != 'reader' OR NOT match(name, '(?i)path|dir|file|disk|log')",
}


def _filters(rules: dict[str, str]) -> str:
    return "".join(
        f"<{_element(name)}><filter>{escape(rule)}</filter></{_element(name)}>"
        for name, rule in rules.items()
    )


def _element(name: str) -> str:
    """A database or table name as the element users.xml names it by."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ServiceError(
            f"the warehouse database {name!r} is not a plain name (letters, digits, _): the "
            "embedded endpoint writes its row policies under that name"
        )
    return name


def workloads(limits: EndpointLimits, roles: Iterable[str]) -> list[str]:
    """The engine's workloads: one per role, each holding at most its share of the server's
    memory (the engine evicts the largest query of a workload past its share), all under the
    server's, and ``default`` for the endpoint's own queries. Created by the engine process
    when it starts (chDB does not load them from its data directory)."""
    names = sorted(set(roles))
    share = limits.user_memory(len(names))
    out = [
        "CREATE OR REPLACE RESOURCE memory (MEMORY RESERVATION)",
        f"CREATE OR REPLACE WORKLOAD all SETTINGS max_memory = {limits.server_memory()}",
        "CREATE OR REPLACE WORKLOAD default IN `all`",
    ]
    out += [
        f"CREATE OR REPLACE WORKLOAD {workload(role)} IN `all` SETTINGS max_memory = {share}"
        for role in names
    ]
    return out


def workload(role: str) -> str:
    """The engine workload of a role's queries (a request sets it with its role marker)."""
    return f"gpugap_{role}"


def prepare_data_dir(path: Path) -> None:
    """Make ``default`` an Atomic database of its own before the engine opens ``path``:
    ``metadata/default.sql`` names it (keeping the UUID, so the tables an earlier version
    created in ``default`` stay), and the ``metadata/default`` link, which the engine writes
    again, is removed first: chDB's overlay would otherwise take the same UUID and abort."""
    metadata = path / "metadata"
    metadata.mkdir(parents=True, exist_ok=True)
    link = metadata / "default"
    declared = metadata / "default.sql"
    if declared.exists():
        if link.is_symlink():
            link.unlink()
        return
    uid = Path(os.readlink(link)).name if link.is_symlink() else str(uuid.uuid4())
    tmp = declared.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(f"ATTACH DATABASE _ UUID '{uid}'\nENGINE = Atomic\n")
    if link.is_symlink():
        link.unlink()
    tmp.replace(declared)
