"""The ClickHouse sink (``gpugap sink clickhouse``), its warehouse client and its migrations."""
