"""``gpugap sink clickhouse``: declared here, built from ``sinks.REGISTRY``. Its settings are
the shared ``GPUGAP_CLICKHOUSE_*`` (the report and the endpoint read them too)."""

from gpugap.groundfloor.plugin import Plugin

PLUGIN = Plugin(
    name="clickhouse",
    help="store gpu.minutes, job/pod events, alerts and dead letters in ClickHouse "
    "(offsets committed only after ClickHouse acknowledged)",
    extra="clickhouse",
    target="gpugap.sinks.clickhouse.sink:ClickHouseSink",
    requires=("clickhouse_connect",),
    kind="sink",
)
