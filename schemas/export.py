"""JSON Schema per topic, for downstream consumers and their validators."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpugap.schemas.topics import TOPICS, Topic


def json_schema(topic: Topic[Any]) -> dict[str, Any]:
    # Validation mode describes what a consumer may receive; the wire form of times (ISO 8601
    # strings) is what it accepts too.
    schema: dict[str, Any] = topic.model.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"urn:gpugap:topic:{topic.name}"
    schema["title"] = topic.name
    schema["description"] = (
        f"{topic.description} Key: {topic.key}. Partitioned by {topic.partitioned_by}."
    )
    schema["x-gpugap-key"] = topic.key
    schema["x-gpugap-partitioned-by"] = topic.partitioned_by
    return schema


def export(directory: Path) -> list[Path]:
    """Write ``<topic>.schema.json`` for every topic; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, topic in TOPICS.items():
        path = directory / f"{name}.schema.json"
        path.write_text(json.dumps(json_schema(topic), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
