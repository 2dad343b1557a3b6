"""The warehouse: ClickHouse's tables and views (``migrations/``, ``cluster.py`` for a
replicated cluster), the one client every part opens it with (``client.py``), the rows the sink
writes (``rows.py``), and the embedded ClickHouse-compatible endpoint over chDB for machines
without a server (``embedded/``). It stands on the ground floor and the schemas only."""
