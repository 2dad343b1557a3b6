"""``gpugap clickhouse serve`` with every SQL-level guard off (no check of what a request
names, no engine grant, constraint or row policy, chDB's own default database): what is left
between a request and the host is the engine process's confinement, which
``GPUGAP_CLICKHOUSE_SERVE_CONFINE`` sets as for the real command. Test-only: nothing in the
installed package reaches ``serve(sql_guards=False)``.

    python -m tests.security.unguarded --path DIR --port N
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.warehouse.embedded import users_from
from gpugap.warehouse.embedded.serve import serve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    serve(
        Path(args.path),
        args.host,
        args.port,
        users_from(ClickHouseSettings()),
        sql_guards=False,
    )


if __name__ == "__main__":
    main()
