"""``gpugap produce transfers-csv``: declared here, built from ``producers.REGISTRY``."""

from gpugap.groundfloor.plugin import Option, Plugin

from .settings import TransfersCsvSettings

PLUGIN = Plugin(
    name="transfers-csv",
    help="import cloud billing egress lines (CSV) as boundary transfers (transfers.v1)",
    extra="all",  # nothing beyond the core (csv, hashlib)
    target="gpugap.producers.transfers.csv_import:TransfersCsv",
    settings=TransfersCsvSettings,
    options=(
        Option(
            "--file",
            "files",
            "a billing CSV ('-' = stdin; repeat)",
            {"action": "append", "metavar": "FILE"},
        ),
        Option(
            "--from-env",
            "from_env",
            "rows without a 'from' column: this environment",
            {"metavar": "ENV"},
        ),
        Option(
            "--to-env", "to_env", "rows without a 'to' column: this environment", {"metavar": "ENV"}
        ),
        Option(
            "--unit", "unit", "unit of the amount column (bytes, GB, GiB...)", {"metavar": "UNIT"}
        ),
        Option(
            "--cluster",
            "cluster",
            "rows without a cluster column: this cluster (the rate card's name for it)",
            {"metavar": "NAME"},
        ),
        Option(
            "--binary-units",
            "binary_units",
            "read KB/MB/GB/TB as KiB/MiB/GiB/TiB, as cloud bills mean them",
            {"action": "store_true"},
        ),
    ),
)
