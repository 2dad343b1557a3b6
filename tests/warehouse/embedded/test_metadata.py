"""The metadata queries BI tools send when they connect and while they browse, verbatim, as the
default user and as the read-only user: they must answer as a ClickHouse server answers them.

Where each query comes from (captured on the wire, or read in the tool's source):
- clickhouse-connect 1.x client start and its SQLAlchemy dialect (Superset's driver);
- Superset's db_engine_specs/clickhouse.py (function names for SQL Lab);
- Grafana's clickhouse-datasource (clickhouse-go's HTTP hello and ping, the query editor's
  schema browser, the bundled dashboards);
- ClickHouse JDBC v2 0.10.0 (DatabaseMetaData, captured from the driver itself) and the
  Metabase ClickHouse driver's own queries (it browses through JDBC's DatabaseMetaData).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import clickhouse_connect
import pytest
import requests
from clickhouse_connect.driver.exceptions import DatabaseError
from pydantic import SecretStr

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.warehouse.client import connect
from tests.harness.warehouse import READER_PASSWORD

USERS = ("default", "reader")
VIEWS = {"v_top_waste", "v_capacity_gap_daily", "v_idle_now", "v_allocations", "v_alerts_open"}
TABLES = {"gpu_hours", "gpu_days", "allocations", "alerts", "schema_migrations"}


def embedded(settings: ClickHouseSettings) -> bool:
    return settings.url.startswith("http://127.0.0.1")


def as_user(settings: ClickHouseSettings, user: str) -> ClickHouseSettings:
    if user == "default":
        return settings
    if not embedded(settings):
        pytest.skip("the read-only BI user is configured on the embedded endpoint")
    return settings.model_copy(update={"user": "reader", "password": SecretStr(READER_PASSWORD)})


@pytest.fixture(params=USERS)
def user(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def who(clickhouse: ClickHouseSettings, user: str) -> ClickHouseSettings:
    return as_user(clickhouse, user)


@pytest.fixture
def client(who: ClickHouseSettings) -> Iterator[Any]:
    c = connect(who)
    try:
        yield c
    finally:
        c.close()


def http(who: ClickHouseSettings, sql: str, **params: str) -> requests.Response:
    """A plain POST, as curl, Grafana's clickhouse-go (HTTP) and the JDBC driver send them."""
    pw = who.password.get_secret_value() if who.password else ""
    return requests.post(
        who.url,
        params={"database": who.database, **params},
        data=sql.encode(),
        auth=(who.user, pw),
        timeout=30,
    )


def rows(who: ClickHouseSettings, sql: str) -> list[list[str]]:
    r = http(who, sql)
    assert r.status_code == 200, f"{sql[:120]}: {r.text[:400]}"
    return [line.split("\t") for line in r.text.splitlines()]


def column(who: ClickHouseSettings, sql: str, i: int = 0) -> list[str]:
    return [row[i] for row in rows(who, sql)]


# --- the client's own start and identity -------------------------------------------------------


def test_clickhouse_connect_start_queries(who: ClickHouseSettings, client: Any, user: str) -> None:
    # what clickhouse-connect sends when a client starts (verbatim)
    version, tz = client.query("SELECT version(), timezone()").result_rows[0]
    assert version.split(".")[0].isdigit() and tz
    got = client.query("SELECT name, value, readonly FROM system.settings LIMIT 10000")
    settings = {name: (value, ro) for name, value, ro in got.result_rows}
    assert settings["readonly"][0] == ("1" if user == "reader" else "0")
    # a server's readonly=1 locks every setting (system.settings says so, and the driver
    # then refuses to send one); the writer may change the allowed ones
    assert settings["max_execution_time"][1] == (1 if user == "reader" else 0)


def test_identity_functions(who: ClickHouseSettings, user: str) -> None:
    [[readonly, database, setting_ro]] = rows(
        who,
        "SELECT getSetting('readonly'), currentDatabase(), "
        "(SELECT value FROM system.settings WHERE name = 'readonly')",
    )
    assert (readonly, setting_ro) == (("1", "1") if user == "reader" else ("0", "0"))
    assert database == who.database
    [[_, version, revision, tz]] = rows(
        who, "SELECT displayName(), version(), revision(), timezone()"
    )
    assert version.count(".") >= 2 and int(revision) > 0 and tz


def test_current_user_is_the_http_user(who: ClickHouseSettings, user: str) -> None:
    if user == "reader":
        pytest.xfail(
            "chDB authenticates every engine connection as its own user 'default' (no per-"
            "connection user, and EXECUTE AS needs access_control_improvements, which "
            "clickhouse-local never reads): currentUser() cannot name the HTTP user"
        )
    assert column(who, "SELECT currentUser()") == [who.user]


# --- clickhouse-connect's SQLAlchemy dialect (Superset) ----------------------------------------


def test_sqlalchemy_dialect_reflects_the_warehouse(who: ClickHouseSettings) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pw = who.password.get_secret_value() if who.password else ""
    host_port = who.url.split("://", 1)[1]
    engine = sqlalchemy.create_engine(f"clickhousedb://{who.user}:{pw}@{host_port}/{who.database}")
    try:
        with engine.connect() as conn:
            inspector = sqlalchemy.inspect(conn)
            assert inspector.default_schema_name == who.database  # SELECT currentDatabase()
            assert who.database in inspector.get_schema_names()  # SHOW DATABASES
            names = set(inspector.get_table_names(who.database))  # SHOW TABLES FROM `db`
            assert names >= TABLES | VIEWS
            views = set(inspector.get_view_names(who.database))  # system.tables, engine View
            assert views >= VIEWS and not views & TABLES
            assert inspector.get_materialized_view_names(who.database) == []
            cols = {
                c["name"]: str(c["type"])
                for c in inspector.get_columns("v_top_waste", who.database)
            }
            assert {"cluster", "allocation_id", "gap_gpu_h"} <= set(cols)  # DESCRIBE TABLE
            assert inspector.has_table("v_top_waste", who.database)  # EXISTS TABLE
            assert not inspector.has_table("no_such_table", who.database)
            assert inspector.get_table_comment("gpu_hours", who.database) == {"text": None}
            assert inspector.get_foreign_keys("gpu_hours", who.database) == []
            # Superset's connection test
            assert conn.execute(sqlalchemy.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_superset_function_names(who: ClickHouseSettings) -> None:
    names = set(column(who, "SELECT name FROM system.functions"))
    assert {"toStartOfHour", "count", "quantile"} <= names
    both = set(
        column(
            who,
            "SELECT name FROM system.functions UNION ALL "
            "SELECT name FROM system.table_functions LIMIT 10000",
        )
    )
    assert {"toStartOfHour", "numbers"} <= both


# --- Grafana's clickhouse-datasource -----------------------------------------------------------

GRAFANA_FUNCTIONS = """
      SELECT
        name, is_aggregate, case_insensitive, alias_to, origin, description,
        syntax, arguments, returned_value, examples, categories
      FROM system.functions
      LIMIT 10000
    """


def test_grafana_connect_and_schema_browser(who: ClickHouseSettings) -> None:
    db = who.database
    assert column(who, "SELECT 1") == ["1"]  # clickhouse-go's ping over HTTP
    assert column(who, "SELECT version()")[0].count(".") >= 2  # health check, ad hoc filters
    assert db in column(who, "SHOW DATABASES")
    assert set(column(who, f'SHOW TABLES FROM "{db}"')) >= TABLES | VIEWS
    assert set(column(who, "SHOW TABLES")) >= TABLES | VIEWS  # with the default database
    desc = rows(who, f'DESC TABLE "{db}"."v_top_waste"')
    assert desc[0][:2] == ["cluster", "LowCardinality(String)"]
    assert rows(who, 'DESC TABLE "v_top_waste"') == desc
    r = http(who, GRAFANA_FUNCTIONS, default_format="TabSeparatedWithNames")
    assert r.status_code == 200, r.text[:300]
    header, *functions = r.text.split("\n", 1)
    assert header.split("\t") == [
        "name", "is_aggregate", "case_insensitive", "alias_to", "origin", "description",
        "syntax", "arguments", "returned_value", "examples", "categories",
    ]  # fmt: skip
    assert "toStartOfHour\t" in functions[0]
    for sql in (
        f"SELECT name, type, table FROM system.columns WHERE database IN ('{db}') "
        "AND table = 'v_top_waste'",
        f"SELECT name, type, table FROM system.columns WHERE database = '{db}' "
        "AND table = 'v_top_waste'",
    ):
        assert rows(who, sql)[0] == ["cluster", "LowCardinality(String)", "v_top_waste"]
    by_table = {
        t
        for _, _, t in rows(
            who, f"SELECT name, type, table FROM system.columns WHERE database IN ('{db}')"
        )
    }
    assert by_table >= TABLES | VIEWS
    assert "v_top_waste" in column(who, "SELECT name, type, table FROM system.columns", 2)
    values = (
        f'SELECT DISTINCT cluster FROM "{db}"."v_top_waste" WHERE cluster IS NOT NULL LIMIT 1000'
    )
    assert http(who, values).status_code == 200
    # the bundled dashboards' variables and panels
    assert db in column(who, "SELECT name FROM system.databases;")
    assert int(column(who, "SELECT uptime() as uptime")[0]) >= 0
    n = column(
        who, f"SELECT count() as \"Number of tables\" FROM system.tables WHERE database IN ('{db}')"
    )
    assert int(n[0]) >= len(TABLES | VIEWS)
    total = (
        'SELECT sum(total_rows) as "Number of rows" FROM system.tables '
        f"WHERE database IN ('{db}');"
    )
    assert int(column(who, total)[0]) >= 0


def test_grafana_settings_clause_is_refused_in_readonly_like_a_server(
    who: ClickHouseSettings, user: str
) -> None:
    """Grafana's JSON-path probe adds SETTINGS max_execution_time=10. A server refuses it to a
    readonly=1 user (Grafana's docs ask for a changeable_in_readonly constraint, which chDB
    cannot load); the same setting as a URL parameter, as clickhouse-go sends it, is applied."""
    sql = (
        f'SELECT DISTINCT cluster FROM "{who.database}"."v_top_waste" '
        "SETTINGS max_execution_time=10"
    )
    r = http(who, sql)
    if user == "reader":
        assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "164"
        assert r.text.count("Code:") == 1, r.text
    else:
        assert r.status_code == 200, r.text
    r = http(who, "SELECT getSetting('max_execution_time')", max_execution_time="10")
    assert r.status_code == 200 and r.text.strip() == "10", r.text


# --- ClickHouse JDBC v2 (DatabaseMetaData) and Metabase ----------------------------------------

JDBC_GET_TABLES = (
    "SELECT '' AS TABLE_CAT, t.database AS TABLE_SCHEM, t.name AS TABLE_NAME, "
    "if(t.is_temporary = 1, concat('Temporary', t.engine), t.engine) AS TABLE_TYPE, "
    "t.comment AS REMARKS, CAST(null as Nullable(String)) AS TYPE_CAT, d.engine AS "
    "TYPE_SCHEM, CAST(null as Nullable(String)) AS TYPE_NAME, CAST(null as "
    "Nullable(String)) AS SELF_REFERENCING_COL_NAME, CAST(null as Nullable(String)) AS "
    "REF_GENERATION FROM system.tables t JOIN system.databases d ON "
    "system.tables.database = system.databases.name WHERE t.database LIKE '{db}' AND "
    "t.name LIKE '%' AND ( (t.engine IN ('ReplicatedMergeTree','PaimonHDFS',"
    "'SharedCoalescingMergeTree','Null','WindowView','TimeSeries','FuzzJSON',"
    "'ReplicatedAggregatingMergeTree','GenerateRandom','Memory','PostgreSQL','LiveView',"
    "'DeltaLakeAzure','AzureBlobStorage','VersionedCollapsingMergeTree','IcebergHDFS',"
    "'MySQL','SQLite','Executable','IcebergAzure','PaimonLocal','Paimon','Buffer',"
    "'SharedReplacingMergeTree','SharedMergeTree','Log',"
    "'SharedVersionedCollapsingMergeTree','SharedAggregatingMergeTree',"
    "'CoalescingMergeTree','FuzzQuery','RemoteSecure','PaimonS3',"
    "'MaterializedPostgreSQL','ReplicatedCollapsingMergeTree','SummingMergeTree',"
    "'SharedSet','Hive','EmbeddedRocksDB','MongoDB','MergeTree',"
    "'SharedGraphiteMergeTree','YTsaurus','SharedJoin','File','IcebergLocal','S3',"
    "'Dictionary','Set','ArrowFlight','SharedCollapsingMergeTree','Kafka','PaimonAzure',"
    "'Remote','ReplicatedVersionedCollapsingMergeTree','FileLog',"
    "'ReplicatedSummingMergeTree','URL','IcebergS3','Hudi','DeltaLakeS3','StripeLog',"
    "'DeltaLake','ReplacingMergeTree','NATS','COSN','JDBC','AzureQueue',"
    "'SharedSummingMergeTree','Loop','CollapsingMergeTree','ExecutablePool',"
    "'ReplicatedGraphiteMergeTree','HDFS','Redis','S3Queue','AggregatingMergeTree',"
    "'Join','ReplicatedReplacingMergeTree','View','OSS','QueryRunner','RabbitMQ',"
    "'GraphiteMergeTree','KeeperMap','ODBC','Merge','GCS','Alias','Distributed',"
    "'Iceberg','TinyLog','MaterializedView','ReplicatedCoalescingMergeTree',"
    "'DeltaLakeLocal')) OR (t.engine NOT IN ('ReplicatedMergeTree','PaimonHDFS',"
    "'SharedCoalescingMergeTree','Null','WindowView','TimeSeries','FuzzJSON',"
    "'ReplicatedAggregatingMergeTree','GenerateRandom','Memory','PostgreSQL','LiveView',"
    "'DeltaLakeAzure','AzureBlobStorage','VersionedCollapsingMergeTree','IcebergHDFS',"
    "'MySQL','SQLite','Executable','IcebergAzure','PaimonLocal','Paimon','Buffer',"
    "'SharedReplacingMergeTree','SharedMergeTree','Log',"
    "'SharedVersionedCollapsingMergeTree','SharedAggregatingMergeTree',"
    "'CoalescingMergeTree','FuzzQuery','RemoteSecure','PaimonS3',"
    "'MaterializedPostgreSQL','ReplicatedCollapsingMergeTree','SummingMergeTree',"
    "'SharedSet','Hive','EmbeddedRocksDB','MongoDB','MergeTree',"
    "'SharedGraphiteMergeTree','YTsaurus','SharedJoin','File','IcebergLocal','S3',"
    "'Dictionary','Set','ArrowFlight','SharedCollapsingMergeTree','Kafka','PaimonAzure',"
    "'Remote','ReplicatedVersionedCollapsingMergeTree','FileLog',"
    "'ReplicatedSummingMergeTree','URL','IcebergS3','Hudi','DeltaLakeS3','StripeLog',"
    "'DeltaLake','ReplacingMergeTree','NATS','COSN','JDBC','AzureQueue',"
    "'SharedSummingMergeTree','Loop','CollapsingMergeTree','ExecutablePool',"
    "'ReplicatedGraphiteMergeTree','HDFS','Redis','S3Queue','AggregatingMergeTree',"
    "'Join','ReplicatedReplacingMergeTree','View','OSS','QueryRunner','RabbitMQ',"
    "'GraphiteMergeTree','KeeperMap','ODBC','Merge','GCS','Alias','Distributed',"
    "'Iceberg','TinyLog','MaterializedView','ReplicatedCoalescingMergeTree',"
    "'DeltaLakeLocal') AND NOT t.engine LIKE 'System%' AND NOT t.engine LIKE 'Async%' "
    "AND t.is_temporary = 0)) AND (t.is_temporary = 0)"
)
JDBC_GET_TABLES_ALL = (
    "SELECT '' AS TABLE_CAT, t.database AS TABLE_SCHEM, t.name AS TABLE_NAME, "
    "if(t.is_temporary = 1, concat('Temporary', t.engine), t.engine) AS TABLE_TYPE, "
    "t.comment AS REMARKS, CAST(null as Nullable(String)) AS TYPE_CAT, d.engine AS "
    "TYPE_SCHEM, CAST(null as Nullable(String)) AS TYPE_NAME, CAST(null as "
    "Nullable(String)) AS SELF_REFERENCING_COL_NAME, CAST(null as Nullable(String)) AS "
    "REF_GENERATION FROM system.tables t JOIN system.databases d ON "
    "system.tables.database = system.databases.name WHERE t.database LIKE '%' AND t.name "
    "LIKE '%' AND ( (t.engine IN ('ReplicatedMergeTree','PaimonHDFS',"
    "'SharedCoalescingMergeTree','Null','WindowView','TimeSeries','FuzzJSON',"
    "'ReplicatedAggregatingMergeTree','GenerateRandom','Memory','PostgreSQL','LiveView',"
    "'DeltaLakeAzure','AzureBlobStorage','VersionedCollapsingMergeTree','IcebergHDFS',"
    "'MySQL','SQLite','Executable','IcebergAzure','PaimonLocal','Paimon','Buffer',"
    "'SharedReplacingMergeTree','SharedMergeTree','Log',"
    "'SharedVersionedCollapsingMergeTree','SharedAggregatingMergeTree',"
    "'CoalescingMergeTree','FuzzQuery','RemoteSecure','PaimonS3',"
    "'MaterializedPostgreSQL','ReplicatedCollapsingMergeTree','SummingMergeTree',"
    "'SharedSet','Hive','EmbeddedRocksDB','MongoDB','MergeTree',"
    "'SharedGraphiteMergeTree','YTsaurus','SharedJoin','File','IcebergLocal','S3',"
    "'Dictionary','Set','ArrowFlight','SharedCollapsingMergeTree','Kafka','PaimonAzure',"
    "'Remote','ReplicatedVersionedCollapsingMergeTree','FileLog',"
    "'ReplicatedSummingMergeTree','URL','IcebergS3','Hudi','DeltaLakeS3','StripeLog',"
    "'DeltaLake','ReplacingMergeTree','NATS','COSN','JDBC','AzureQueue',"
    "'SharedSummingMergeTree','Loop','CollapsingMergeTree','ExecutablePool',"
    "'ReplicatedGraphiteMergeTree','HDFS','Redis','S3Queue','AggregatingMergeTree',"
    "'Join','ReplicatedReplacingMergeTree','View','OSS','QueryRunner','RabbitMQ',"
    "'GraphiteMergeTree','KeeperMap','ODBC','Merge','GCS','Alias','Distributed',"
    "'Iceberg','TinyLog','MaterializedView','ReplicatedCoalescingMergeTree',"
    "'DeltaLakeLocal')) OR (t.engine NOT IN ('ReplicatedMergeTree','PaimonHDFS',"
    "'SharedCoalescingMergeTree','Null','WindowView','TimeSeries','FuzzJSON',"
    "'ReplicatedAggregatingMergeTree','GenerateRandom','Memory','PostgreSQL','LiveView',"
    "'DeltaLakeAzure','AzureBlobStorage','VersionedCollapsingMergeTree','IcebergHDFS',"
    "'MySQL','SQLite','Executable','IcebergAzure','PaimonLocal','Paimon','Buffer',"
    "'SharedReplacingMergeTree','SharedMergeTree','Log',"
    "'SharedVersionedCollapsingMergeTree','SharedAggregatingMergeTree',"
    "'CoalescingMergeTree','FuzzQuery','RemoteSecure','PaimonS3',"
    "'MaterializedPostgreSQL','ReplicatedCollapsingMergeTree','SummingMergeTree',"
    "'SharedSet','Hive','EmbeddedRocksDB','MongoDB','MergeTree',"
    "'SharedGraphiteMergeTree','YTsaurus','SharedJoin','File','IcebergLocal','S3',"
    "'Dictionary','Set','ArrowFlight','SharedCollapsingMergeTree','Kafka','PaimonAzure',"
    "'Remote','ReplicatedVersionedCollapsingMergeTree','FileLog',"
    "'ReplicatedSummingMergeTree','URL','IcebergS3','Hudi','DeltaLakeS3','StripeLog',"
    "'DeltaLake','ReplacingMergeTree','NATS','COSN','JDBC','AzureQueue',"
    "'SharedSummingMergeTree','Loop','CollapsingMergeTree','ExecutablePool',"
    "'ReplicatedGraphiteMergeTree','HDFS','Redis','S3Queue','AggregatingMergeTree',"
    "'Join','ReplicatedReplacingMergeTree','View','OSS','QueryRunner','RabbitMQ',"
    "'GraphiteMergeTree','KeeperMap','ODBC','Merge','GCS','Alias','Distributed',"
    "'Iceberg','TinyLog','MaterializedView','ReplicatedCoalescingMergeTree',"
    "'DeltaLakeLocal') AND NOT t.engine LIKE 'System%' AND NOT t.engine LIKE 'Async%' "
    "AND t.is_temporary = 0) OR (t.engine LIKE 'System%' OR t.engine LIKE 'Async%') OR "
    "(t.is_temporary = 1))"
)
JDBC_GET_COLUMNS = (
    "SELECT '' AS TABLE_CAT, database AS TABLE_SCHEM, table AS TABLE_NAME, name AS "
    "COLUMN_NAME, toInt32(1111) AS DATA_TYPE, type AS TYPE_NAME, "
    "toInt32(multiIf(character_octet_length IS NOT NULL, character_octet_length, "
    "system.columns.type == 'Bool', 1, system.columns.type == 'Date', 2, "
    "system.columns.type == 'Date32', 4, system.columns.type == 'DateTime32', 4, "
    "system.columns.type == 'DateTime64', 8, system.columns.type == 'Enum8', 1, "
    "system.columns.type == 'Enum16', 2, system.columns.type == 'Int8', 1, "
    "system.columns.type == 'UInt8', 1, system.columns.type == 'Int16', 2, "
    "system.columns.type == 'UInt16', 2, system.columns.type == 'Int32', 4, "
    "system.columns.type == 'UInt32', 4, system.columns.type == 'Int64', 8, "
    "system.columns.type == 'IntervalYear', 8, system.columns.type == 'IntervalQuarter', "
    "8, system.columns.type == 'IntervalMonth', 8, system.columns.type == 'IntervalWeek',"
    " 8, system.columns.type == 'IntervalDay', 8, system.columns.type == 'IntervalHour', "
    "8, system.columns.type == 'IntervalMinute', 8, system.columns.type == "
    "'IntervalSecond', 8, system.columns.type == 'IntervalMicrosecond', 8, "
    "system.columns.type == 'IntervalMillisecond', 8, system.columns.type == "
    "'IntervalNanosecond', 8, system.columns.type == 'UInt64', 8, system.columns.type == "
    "'Int128', 16, system.columns.type == 'UInt128', 16, system.columns.type == 'Int256',"
    " 32, system.columns.type == 'UInt256', 32, system.columns.type == 'Decimal32', 4, "
    "system.columns.type == 'Decimal64', 8, system.columns.type == 'Decimal128', 16, "
    "system.columns.type == 'Decimal256', 32, system.columns.type == 'BFloat16', 2, "
    "system.columns.type == 'Float32', 4, system.columns.type == 'Float64', 8, "
    "system.columns.type == 'IPv4', 4, system.columns.type == 'IPv6', 16, "
    "system.columns.type == 'UUID', 16, system.columns.type == 'Point', 33, "
    "system.columns.type == 'Time', 4, system.columns.type == 'Time64', 8, "
    "numeric_precision IS NOT NULL, numeric_precision, 0)) AS COLUMN_SIZE, toInt32(0) AS "
    "BUFFER_LENGTH, toInt32(IF (numeric_scale == 0, NULL, numeric_scale)) as "
    "DECIMAL_DIGITS,  toInt32(numeric_precision_radix) AS NUM_PREC_RADIX, "
    "toInt32(position(type, 'Nullable(') >= 1 ?1 : 0) as NULLABLE, "
    "system.columns.comment AS REMARKS, system.columns.default_expression AS COLUMN_DEF, "
    "toInt32(0) AS SQL_DATA_TYPE, toInt32(0) AS SQL_DATETIME_SUB, "
    "character_octet_length::Nullable(Int32) AS CHAR_OCTET_LENGTH, "
    "toInt32(system.columns.position) AS ORDINAL_POSITION, position(upper(type), "
    "'NULLABLE') >= 1 ? 'YES' : 'NO' AS IS_NULLABLE,CAST(NULL as Nullable(String)) AS "
    "SCOPE_CATALOG, CAST(NULL as Nullable(String)) AS SCOPE_SCHEMA, CAST(NULL as "
    "Nullable(String)) AS SCOPE_TABLE, CAST(NULL as Nullable(Int16)) AS SOURCE_DATA_TYPE,"
    " 'NO' as IS_AUTOINCREMENT, 'NO' as IS_GENERATEDCOLUMN  FROM system.columns WHERE "
    "database LIKE '{db}' AND table LIKE 'v_top_waste' AND name LIKE '%' ORDER BY "
    "TABLE_SCHEM, TABLE_NAME, ORDINAL_POSITION"
)
JDBC_GET_TYPE_INFO = (
    "SELECT name AS TYPE_NAME, CAST(0 as Int32) AS DATA_TYPE, CAST(attrs.c2 AS "
    "Nullable(Int32)) AS PRECISION, CAST(NULL as Nullable(String)) AS LITERAL_PREFIX, "
    "CAST(NULL as Nullable(String)) AS LITERAL_SUFFIX, CAST(NULL as Nullable(String)) AS "
    "CREATE_PARAMS, CAST(0 AS Int16) AS NULLABLE, CAST(not(dt.case_insensitive) AS "
    "Boolean) AS CASE_SENSITIVE, 3::Int16 AS SEARCHABLE, CAST( not(attrs.c3) AS Boolean) "
    "AS UNSIGNED_ATTRIBUTE, false AS FIXED_PREC_SCALE, false AS AUTO_INCREMENT, "
    "if(empty(alias_to), name, alias_to) AS LOCAL_TYPE_NAME, CAST(attrs.c4 AS "
    "Nullable(Int16)) AS MINIMUM_SCALE, CAST(attrs.c5 AS Nullable(Int16)) AS "
    "MAXIMUM_SCALE, CAST(0 AS Nullable(Int32)) AS SQL_DATA_TYPE, CAST(0 AS "
    "Nullable(Int32)) AS SQL_DATETIME_SUB, CAST(0 AS Nullable(Int32)) AS NUM_PREC_RADIX "
    "FROM system.data_type_families dt  LEFT JOIN (SELECT * FROM VALUES ( ('Bool',1,true,"
    "0,0),('Date',10,false,0,0),('Date32',10,false,0,0),('DateTime',29,false,0,9),"
    "('DateTime32',19,false,0,0),('DateTime64',29,false,0,9),('Enum',0,false,0,0),"
    "('Enum8',0,false,0,0),('Enum16',0,false,0,0),('FixedString',0,false,0,0),('Int8',3,"
    "true,0,0),('UInt8',3,false,0,0),('Int16',5,true,0,0),('UInt16',5,false,0,0),"
    "('Int32',10,true,0,0),('UInt32',10,false,0,0),('Int64',19,true,0,0),('IntervalYear',"
    "19,true,0,0),('IntervalQuarter',19,true,0,0),('IntervalMonth',19,true,0,0),"
    "('IntervalWeek',19,true,0,0),('IntervalDay',19,true,0,0),('IntervalHour',19,true,0,"
    "0),('IntervalMinute',19,true,0,0),('IntervalSecond',19,true,0,0),"
    "('IntervalMicrosecond',19,true,0,0),('IntervalMillisecond',19,true,0,0),"
    "('IntervalNanosecond',19,true,0,0),('UInt64',20,false,0,0),('Int128',39,true,0,0),"
    "('UInt128',39,false,0,0),('Int256',77,true,0,0),('UInt256',78,false,0,0),('Decimal',"
    "76,true,0,76),('Decimal32',9,true,0,9),('Decimal64',18,true,0,18),('Decimal128',38,"
    "true,0,38),('Decimal256',76,true,0,76),('BFloat16',3,true,0,16),('Float32',12,true,"
    "0,38),('Float64',22,true,0,308),('IPv4',10,false,0,0),('IPv6',39,false,0,0),('UUID',"
    "69,false,0,0),('Point',0,true,0,0),('Polygon',0,true,0,0),('MultiPolygon',0,true,0,"
    "0),('Ring',0,true,0,0),('LineString',0,true,0,0),('MultiLineString',0,true,0,0),"
    "('Geometry',0,true,0,0),('JSON',0,false,0,0),('Object',0,false,0,0),('String',0,"
    "false,0,0),('Array',0,false,0,0),('Map',0,false,0,0),('Nested',0,false,0,0),"
    "('Tuple',0,false,0,0),('Nothing',0,false,0,0),('LowCardinality',0,false,0,0),"
    "('Nullable',0,false,0,0),('SimpleAggregateFunction',0,false,0,0),"
    "('AggregateFunction',0,false,0,0),('Variant',0,false,0,0),('Dynamic',0,false,0,0),"
    "('Time',9,false,0,9),('Time64',9,false,0,0),('QBit',0,false,0,0)) ) as attrs ON "
    "(dt.name = attrs.c1) WHERE alias_to == ''  ORDER BY name"
)


def test_jdbc_database_metadata(who: ClickHouseSettings) -> None:
    db = who.database
    assert column(who, "SELECT version() as server_version")[0].count(".") >= 2
    schemas = column(
        who, "SELECT name AS TABLE_SCHEM, '' AS TABLE_CATALOG FROM system.databases ORDER BY name"
    )
    assert db in schemas and "system" in schemas
    like = (
        "SELECT name AS TABLE_SCHEM, '' AS TABLE_CATALOG FROM system.databases WHERE name LIKE '%'"
    )
    assert set(column(who, like)) == set(schemas)
    assert rows(who, "SELECT 'local' AS TABLE_CAT  WHERE 1 = 0") == []
    types = column(
        who,
        "SELECT arrayJoin(['DICTIONARY','LOG TABLE','MATERIALIZED VIEW','MEMORY TABLE',"
        "'REMOTE TABLE','SYSTEM TABLE','TABLE','TEMPORARY TABLE','VIEW']) AS TABLE_TYPE "
        "ORDER BY TABLE_TYPE",
    )
    assert "VIEW" in types and len(types) == 9
    tables = {r[2]: r[3] for r in rows(who, JDBC_GET_TABLES.format(db=db))}
    assert set(tables) >= TABLES | VIEWS
    assert {tables[v] for v in VIEWS} == {"View"}
    assert "MergeTree" in tables["gpu_hours"]
    everything = {(r[1], r[2]) for r in rows(who, JDBC_GET_TABLES_ALL)}
    assert (db, "v_top_waste") in everything and ("system", "tables") in everything
    columns = rows(who, JDBC_GET_COLUMNS.format(db=db))
    assert [c[3] for c in columns[:2]] == ["cluster", "allocation_id"]
    assert columns[0][5] == "LowCardinality(String)"
    pks = column(
        who,
        "SELECT NULL::Nullable(String) AS TABLE_CAT, system.tables.database AS TABLE_SCHEM, "
        "system.tables.name AS TABLE_NAME, trim(c.1) AS COLUMN_NAME, CAST(c.2 AS Int16) AS "
        "KEY_SEQ, 'PRIMARY' AS PK_NAME FROM system.tables ARRAY JOIN arrayZip(splitByChar(',', "
        "primary_key), arrayEnumerate(splitByChar(',', primary_key))) as c WHERE "
        f"system.tables.primary_key <> '' AND system.tables.database ILIKE '{db}' AND "
        "system.tables.name ILIKE 'gpu_hours' ORDER BY COLUMN_NAME",
        3,
    )
    assert "hour" in pks
    assert "String" in column(who, JDBC_GET_TYPE_INFO)
    functions = column(
        who,
        "SELECT CAST(NULL as Nullable(String)) AS FUNCTION_CAT, CAST(NULL as Nullable(String)) "
        "AS FUNCTION_SCHEM, CAST(name as Nullable(String)) AS FUNCTION_NAME, concat(description, "
        "'(', origin, ')') AS REMARKS, CAST(0 AS Int16) AS FUNCTION_TYPE, name AS SPECIFIC_NAME "
        "FROM system.functions WHERE name LIKE '%'",
        2,
    )
    assert "toStartOfHour" in functions
    info = (
        "SELECT c1 as NAME, c2 as MAX_LEN, c3 as DEFAULT_VALUE, c4 as DESCRIPTION FROM VALUES "
        "(('ApplicationName', 255, '', 'Client application name.'))"
    )
    assert column(who, info) == ["ApplicationName"]


def test_metabase_queries(who: ClickHouseSettings) -> None:
    assert column(who, "SELECT 1") == ["1"]  # can-connect?
    assert column(who, "SELECT value='1' FROM system.settings WHERE name='cloud_mode'") == ["0"]
    assert column(who, "SELECT timezone() AS tz")[0]
    [[ver, major, _]] = rows(
        who,
        "WITH s AS (SELECT version() AS ver, splitByChar('.', ver) AS verSplit) "
        "SELECT s.ver, toInt32(verSplit[1]), toInt32(verSplit[2]) FROM s",
    )
    assert ver.startswith(major + ".")
    exists = f"SELECT count(*) > 0 FROM system.databases WHERE name = '{who.database}'"
    assert column(who, exists) == ["1"]


# --- browsing statements and the system tables' shape ------------------------------------------


def test_show_desc_exists(who: ClickHouseSettings) -> None:
    db = who.database
    create = http(who, f"SHOW CREATE TABLE {db}.v_top_waste", default_format="TSVRaw")
    assert create.status_code == 200 and create.text.startswith(f"CREATE VIEW {db}.v_top_waste")
    assert column(who, f"EXISTS TABLE {db}.v_top_waste") == ["1"]
    assert column(who, f"EXISTS {db}.gpu_hours") == ["1"]
    assert column(who, f"EXISTS TABLE {db}.no_such_table") == ["0"]
    assert column(who, f"EXISTS DATABASE {db}") == ["1"]
    assert column(who, f"DESCRIBE TABLE {db}.gpu_hours")[0] == "hour"
    assert "hour" in column(who, f"SHOW COLUMNS FROM {db}.gpu_hours")
    assert column(who, "SHOW SETTINGS LIKE 'readonly'") == ["readonly"]


# columns BI tools read from the system tables, as a ClickHouse server has them
SYSTEM_COLUMNS = {
    "databases": {"name", "engine", "data_path", "metadata_path", "uuid", "comment"},
    "tables": {
        "database", "name", "uuid", "engine", "is_temporary", "metadata_modification_time",
        "create_table_query", "engine_full", "partition_key", "sorting_key", "primary_key",
        "total_rows", "total_bytes", "comment",
    },
    "columns": {
        "database", "table", "name", "type", "position", "default_kind", "default_expression",
        "comment", "is_in_primary_key", "is_in_sorting_key", "character_octet_length",
        "numeric_precision", "numeric_scale", "datetime_precision",
    },
    "functions": {
        "name", "is_aggregate", "case_insensitive", "alias_to", "origin", "description",
        "syntax", "arguments", "returned_value", "examples", "categories",
    },
    "table_functions": {"name", "description"},
    "data_type_families": {"name", "case_insensitive", "alias_to"},
    "settings": {"name", "value", "changed", "description", "min", "max", "readonly", "type"},
}  # fmt: skip


@pytest.mark.parametrize("table", sorted(SYSTEM_COLUMNS))
def test_system_tables_have_the_servers_columns(who: ClickHouseSettings, table: str) -> None:
    assert set(column(who, f"DESCRIBE TABLE system.{table}")) >= SYSTEM_COLUMNS[table]
    assert rows(who, f"SELECT count() FROM system.{table}")[0][0] != "0"


# --- the reader reads, and only reads ----------------------------------------------------------


def test_reader_writes_are_refused_with_readonly(clickhouse: ClickHouseSettings) -> None:
    reader = as_user(clickhouse, "reader")
    db = clickhouse.database
    statements = (
        f"INSERT INTO {db}.idle_policy SELECT * FROM {db}.idle_policy LIMIT 0",
        f"CREATE TABLE {db}.x (a UInt8) ENGINE = Memory",
        f"CREATE VIEW {db}.vx AS SELECT 1",
        f"DROP TABLE {db}.gpu_hours",
        f"TRUNCATE TABLE {db}.gpu_hours",
        f"ALTER TABLE {db}.gpu_hours DELETE WHERE 1",
        f"RENAME TABLE {db}.gpu_hours TO {db}.gpu_hours2",
        f"OPTIMIZE TABLE {db}.gpu_hours",
        f"CREATE DATABASE {db}_2",
        "SET readonly = 0",
    )
    c = connect(reader)
    try:
        for sql in statements:
            with pytest.raises(DatabaseError) as err:
                c.command(sql)
            assert err.value.code == 164, sql
            r = http(reader, sql)
            assert r.status_code == 403, (sql, r.text)
            assert r.headers["X-ClickHouse-Exception-Code"] == "164"
            assert r.text.startswith("Code: 164. DB::Exception: ") and r.text.count("Code:") == 1
            assert "default:" not in r.text  # the engine's own user is not who asked
        assert set(column(reader, f"SHOW TABLES FROM {db}")) >= TABLES | VIEWS
    finally:
        c.close()


def test_reader_readonly_url_parameter_cannot_lift_it(clickhouse: ClickHouseSettings) -> None:
    reader = as_user(clickhouse, "reader")
    r = http(reader, "SELECT getSetting('readonly')", readonly="0")
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "164"
    client = clickhouse_connect.get_client(
        host=reader.url.split("//")[1].split(":")[0],
        port=int(reader.url.rsplit(":", 1)[1]),
        username="reader",
        password=READER_PASSWORD,
    )
    try:
        assert client.query("SELECT getSetting('readonly')").result_rows == [(1,)]
    finally:
        client.close()


def test_reader_cannot_kill_queries(clickhouse: ClickHouseSettings) -> None:
    """readonly=1 lets KILL QUERY through, and every engine connection is one user: a reader
    would reach the writer's queries: refused (policy.check_statement, on the engine's AST)."""
    reader = as_user(clickhouse, "reader")
    r = http(reader, "KILL QUERY WHERE 0")
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "497"


def test_check_reader_refuses_kill_only() -> None:
    from gpugap.warehouse.embedded import policy
    from gpugap.warehouse.embedded.errors import EngineError

    kill = policy.Statement("KILL QUERY WHERE 0", "KillQueryQuery Literal_UInt64_0 ASYNC", "")
    with pytest.raises(EngineError) as err:
        policy.check_statement(kill, frozenset(), reader=True)
    assert err.value.code == 497
    policy.check_statement(kill, frozenset(), reader=False)
    select = policy.Statement("SELECT 1", "SelectWithUnionQuery", "")
    policy.check_statement(select, frozenset(), reader=True)


def test_engine_messages_read_as_a_servers() -> None:
    from gpugap.warehouse.embedded.errors import EngineError

    nested = EngineError(
        "Code: 164. DB::Exception: Code: 164. DB::Exception: Cannot modify 'max_threads' "
        "setting in readonly mode. (READONLY) (version 26.9.2.1). (READONLY)"
    )
    assert nested.message == (
        "Code: 164. DB::Exception: Cannot modify 'max_threads' setting in readonly mode. (READONLY)"
    )
    assert (nested.code, nested.name) == (164, "READONLY")
    engine_user = EngineError(
        "Code: 164. DB::Exception: default: Cannot execute query in readonly mode. (READONLY)"
    )
    assert engine_user.message == (
        "Code: 164. DB::Exception: Cannot execute query in readonly mode. (READONLY)"
    )
    # a message of the HTTP layer's own keeps the name it was given
    auth = EngineError("default: Authentication failed", 516, "AUTHENTICATION_FAILED")
    assert "default: Authentication failed" in auth.message
