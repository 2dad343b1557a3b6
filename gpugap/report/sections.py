"""A section another package adds to the report (``--cost``, ``--queue``): one member of the
JSON and of its schema, rows after the CSV's, a block after the table."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel


def extend_schema(schema: dict[str, Any], member: str, model: type[BaseModel]) -> dict[str, Any]:
    """The report's JSON Schema with ``member``, a ``model``."""
    name = model.__name__
    own = model.model_json_schema(mode="serialization", ref_template="#/$defs/{model}")
    defs = {**schema.get("$defs", {}), **own.pop("$defs", {}), name: own}
    out = {**schema, "$defs": defs}
    out["properties"] = {**schema["properties"], member: {"$ref": f"#/$defs/{name}"}}
    out["required"] = [*schema.get("required", []), member]
    return out


def with_section(
    report_text: str,
    fmt: str,
    member: str,
    section: BaseModel,
    *,
    csv_rows: Callable[[], str],
    table: Callable[[], str],
) -> str:
    """The report as ``render`` printed it, with the section: a ``member`` of the JSON, its
    ``csv_rows`` after the CSV's, its ``table`` after the table."""
    if fmt == "json":
        doc = json.loads(report_text)
        doc[member] = section.model_dump(mode="json")
        return json.dumps(doc, indent=2)
    return report_text + "\n" + (csv_rows() if fmt == "csv" else table())
