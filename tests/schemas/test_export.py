import json
from pathlib import Path

import jsonschema
import pytest

from gpugap.cli import main
from gpugap.schemas import TOPICS, encode
from gpugap.schemas.examples import node_samples, one_of_each


def test_export_writes_one_schema_per_topic_that_validates_real_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schemas", "export", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(f"{name}.schema.json" for name in TOPICS)
    examples = one_of_each()
    for name in TOPICS:
        schema = json.loads((tmp_path / f"{name}.schema.json").read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        validator.validate(json.loads(encode(examples[name])))
    samples = json.loads((tmp_path / "gpu.samples.v1.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(samples)
    for record in node_samples(50):
        validator.validate(json.loads(encode(record)))
    # and the schema is strict where the models are
    bad = json.loads(encode(next(node_samples(1))))
    bad["gpus"][0]["activity"] = 1.5
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)
