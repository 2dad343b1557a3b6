"""Which engine settings a client may change, as an explicit list of names.

The list (``allowed_settings.txt`` beside this file, a name and the reason's key a line) is
derived from the engine's own ``system.settings`` by ``derive()``: the families below, less every
setting whose name or description speaks of a path, a file, a URL or a schema (those read or
write the host, or reach the network, whoever sets them), less the names that would lift a
bound shared with other users. The result is reviewed and committed; the engine's profile makes
every other setting constant (engine_config.py). After a chDB upgrade, regenerate it and review the
difference: ``python -m warehouse.embedded.allowed --write``
(``tests/security/test_settings_list.py`` fails until the committed list is the derived one).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path

# why a family may be changed: the key is written beside each name in the list
REASONS = {
    "output": "how a result is written (text escaping, quoting, JSON and Arrow details)",
    "input": "how INSERT data is parsed (the client's own data, in the request body)",
    "format": "delimiters, escaping and inline templates of text formats (never a file's name)",
    "time": "how dates, times and intervals are read and printed",
    "cast": "how CAST and type conversions behave",
    "join": "the join algorithm and its per-query limits",
    "plan": "optimizer and planner switches: they change the plan, not what is read",
    "limit": "per-query limits a client may set for itself (the four that bound the endpoint "
    "have a maximum nobody can raise)",
    "client": "a setting that ClickHouse clients and BI tools send (reviewed one by one)",
    "filter": "row filters of BI tools (Grafana's ad hoc filters): SQL, so each filter is read "
    "by the engine and checked like a query before it is applied",
}
FAMILIES = {
    "output_format_": "output",
    "input_format_": "input",
    "format_": "format",
    "date_time_": "time",
    "interval_output": "time",
    "cast_": "cast",
    "join_": "join",
    "partial_merge_join_": "join",
    "optimize_": "plan",
    "preferred_": "plan",
    "low_cardinality_": "output",
    "max_": "limit",
    "min_": "limit",
}
CLIENT = frozenset(
    {
        "result_overflow_mode", "read_overflow_mode", "group_by_overflow_mode",
        "sort_overflow_mode", "set_overflow_mode", "distinct_overflow_mode", "extremes",
        "totals_mode", "final", "insert_deduplicate", "insert_deduplication_token", "async_insert",
        "wait_for_async_insert", "mutations_sync", "lightweight_deletes_sync",
        "prefer_column_name_to_alias", "aggregate_functions_null_for_empty",
        "data_type_default_nullable", "union_default_mode", "joined_subquery_requires_alias",
        "function_sleep_max_microseconds_per_block", "transform_null_in", "session_timezone",
        "query_cache_ttl", "http_zlib_compression_level", "limit", "offset",
        "distributed_product_mode", "any_join_distinct_right_table_keys", "group_by_use_nulls",
        "exact_rows_before_limit", "rows_before_aggregation", "count_distinct_implementation",
        "use_query_cache", "use_skip_indexes", "use_index_for_in_with_subqueries",
        "apply_mutations_on_fly", "query_plan_enable_optimizations", "precise_float_parsing",
        "mysql_map_string_to_text_in_show_columns",
        "mysql_map_fixed_string_to_text_in_show_columns",
        "show_table_uuid_in_table_create_query_if_not_nil", "system_events_show_zero_values",
        "allow_settings_after_format_in_insert", "enable_positional_arguments",
        "enable_analyzer", "allow_experimental_analyzer", "enable_order_by_all",
        "enable_named_columns_in_function_tuple", "enable_extended_results_for_datetime_functions",
        "allow_experimental_object_type", "allow_experimental_json_type", "enable_json_type",
        "allow_experimental_variant_type", "enable_variant_type",
        "allow_experimental_dynamic_type", "enable_dynamic_type", "allow_experimental_map_type",
        "allow_experimental_bigint_types", "allow_experimental_window_functions",
        "allow_experimental_geo_types", "allow_suspicious_low_cardinality_types",
        "allow_nondeterministic_mutations", "max_execution_time", "max_memory_usage",
        "http_native_compression_disable_checksumming_on_decompress", "max_threads",
        "max_result_bytes", "max_query_size", "max_result_rows", "max_rows_to_read",
        "max_bytes_to_read",
    }
)  # fmt: skip
# SQL expressions in a setting: each read by the engine and checked (policy.check_filters)
FILTERS = frozenset({"additional_table_filters", "additional_result_filter"})
# never a client's, whatever their family: the endpoint sets them for everyone
# (engine_config.FORCED).
# Values data with expression interpretation runs SQL found in INSERT data and in format(),
# and the engine's log would carry what a query wrote in it
NEVER = frozenset(
    {
        "input_format_values_interpret_expressions",
        "input_format_values_deduce_templates_of_expressions",
        "send_logs_level",
    }
)
# the words that end a setting's candidacy (in its name or its description)
HOST_WORDS = re.compile(r"\b(paths?|files?|filenames?|urls?|uris?|schemas?)\b", re.IGNORECASE)
# a family's member that also speaks of these is left out: it reaches the disk, the network or
# another server, or shapes a format by a schema
FAMILY_WORDS = re.compile(
    r"\b(filesystems?|director(y|ies)|disks?|s3|hdfs|azure|kafka|keeper|"
    r"zookeeper|remote|http|network|sockets?|secrets?|replicas?|iceberg|delta|hive|avro|protobuf|"
    r"capn ?proto|msgpack)\b",
    re.IGNORECASE,
)
# bounds shared with other users or the process: never the client's to move
SHARED = re.compile(
    r"(_for_user|_for_all_users|_for_server|_for_query$|threads|bandwidth|concurrent|sessions|"
    r"external|temporary|_to_drop$|_memory_usage|untracked|server_|insert_block_size)"
)

_FILE = "allowed_settings.txt"


def derive(settings: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The allowed settings, name -> reason key, from rows of ``system.settings`` (name,
    description, alias_for). An alias is allowed exactly when the setting it names is (a
    constant alias would freeze its target)."""
    out: dict[str, str] = {}
    rows = list(settings)
    for row in rows:
        if row.get("alias_for"):
            continue
        name, text = row["name"], row["description"]
        words = f"{name.replace('_', ' ')} {text}"
        if name in NEVER:
            continue
        if name in FILTERS:
            out[name] = "filter"
            continue
        if HOST_WORDS.search(words):
            continue
        if name in CLIENT:
            out[name] = "client"
            continue
        family = next((r for p, r in FAMILIES.items() if name.startswith(p)), None)
        if family is None or FAMILY_WORDS.search(words) or SHARED.search(name):
            continue
        out[name] = family
    for row in rows:
        target = row.get("alias_for")
        if target:
            out.pop(row["name"], None)
            if target in out:
                out[row["name"]] = out[target]
    return dict(sorted(out.items()))


@functools.lru_cache(maxsize=1)
def committed() -> dict[str, str]:
    """The reviewed list: name -> reason key."""
    text = resources.files(__package__).joinpath(_FILE).read_text()
    pairs = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {name: reason for name, reason in pairs}


def render(allowed: Mapping[str, str]) -> str:
    head = [
        "# Settings a client of the embedded endpoint may change: name, reason (allowed.py's",
        "# REASONS). Generated by `python -m warehouse.embedded.allowed --write`; review",
        "# what changed before committing it.",
    ]
    return "\n".join([*head, *(f"{n} {r}" for n, r in allowed.items())]) + "\n"


DOC_START, DOC_END = "<!-- allowed-settings:start -->", "<!-- allowed-settings:end -->"


def render_doc(allowed: Mapping[str, str]) -> str:
    """The list as docs/security.md shows it: by reason, every name."""
    out = [DOC_START]
    for key, why in REASONS.items():
        names = [n for n, r in allowed.items() if r == key]
        if names:
            out += ["", f"<details><summary><b>{key}</b> ({len(names)}): {why}</summary>", ""]
            out += [", ".join(f"`{n}`" for n in names), "", "</details>"]
    return "\n".join([*out, "", DOC_END])


def doc_block(text: str) -> str | None:
    """The generated block of a document, or None."""
    start, end = text.find(DOC_START), text.find(DOC_END)
    return text[start : end + len(DOC_END)] if 0 <= start < end else None


def engine_settings() -> list[dict[str, str]]:
    """name, description and alias_for of every setting of this process's chDB."""
    import chdb

    conn = chdb.connect(":memory:")
    try:
        sql = "SELECT name, description, alias_for FROM system.settings"
        res = conn._conn.query(sql, "JSONEachRow")
        return [json.loads(line) for line in (res.bytes() or b"").decode().splitlines()]
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {_FILE} and the doc")
    parser.add_argument("--doc", default="docs/security.md", help="the document listing them")
    args = parser.parse_args(argv)
    derived = derive(engine_settings())
    old = committed()
    for name in sorted(set(derived) - set(old)):
        print(f"+ {name} ({derived[name]})")
    for name in sorted(set(old) - set(derived)):
        print(f"- {name}")
    if args.write:
        Path(__file__).with_name(_FILE).write_text(render(derived))
        print(f"{len(derived)} settings written to {_FILE}")
        doc = Path(args.doc)
        text = doc.read_text()
        block = doc_block(text)
        if block is None:
            print(f"{doc} has no {DOC_START} ... {DOC_END} block: not changed")
        else:
            doc.write_text(text.replace(block, render_doc(derived)))
            print(f"the list in {doc} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
