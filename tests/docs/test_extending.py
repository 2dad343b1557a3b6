"""docs/extending.md stays true: its blocks, copied into a scratch tree with its registry
lines, are a producer and a sink that run through the real CLI and the batching base."""

from __future__ import annotations

import asyncio
import json
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpugap import producers, sinks
from gpugap.cli import main
from gpugap.groundfloor.settings import Settings
from gpugap.schemas import decode
from gpugap.schemas.examples import node_samples
from gpugap.schemas.topics import MINUTES, SAMPLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
# recorded from nvidia-smi 550 on a DGX A100 (one MIG-enabled GPU reports [N/A])
RECORDED = """\
0, GPU-4b7c4c77-1f4f-9b0e-3c6b-0d5f0a9f7e11, 87, 40321, 81920, NVIDIA A100-SXM4-80GB
1, GPU-9d1e6a32-2c5b-4a7e-8f3d-1b2c3d4e5f60, [N/A], 1201, 81920, NVIDIA A100-SXM4-80GB
"""


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The page's files under tmp_path, found as producers.smi and sinks.jsonl."""
    registered = 0
    for block in BLOCKS:
        first, _, body = block.partition("\n")
        if first.startswith("# ") and first.endswith(".py"):
            path = tmp_path / first[2:]
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "__init__.py").touch()
            path.write_text(body)
        elif (line := re.fullmatch(r'\s*"(\w+)": "([\w.:]+)",\n', block)) is not None:
            registry = (
                producers.REGISTRY if line[2].startswith("gpugap.producers.") else sinks.REGISTRY
            )
            monkeypatch.setitem(registry, line[1], line[2])
            registered += 1
    assert registered == 2, "the page shows one registry line for each part"
    monkeypatch.setattr(producers, "__path__", [*producers.__path__, str(tmp_path / "producers")])
    monkeypatch.setattr(sinks, "__path__", [*sinks.__path__, str(tmp_path / "sinks")])
    yield tmp_path
    for name in [
        m for m in sys.modules if m.startswith(("gpugap.producers.smi", "gpugap.sinks.jsonl"))
    ]:
        del sys.modules[name]


def test_the_example_is_under_100_lines() -> None:
    code = [b for b in BLOCKS if b.startswith("# ") or '": "' in b]
    # non-blank lines, without the comment naming each file
    lines = sum(len([x for x in b.splitlines()[1:] if x.strip()]) for b in code if "\n" in b)
    lines += sum(1 for b in code if b.count("\n") == 1)  # the registry lines
    assert lines < 100
    assert f"is {lines} lines of code" in DOC.read_text()  # the page says how long it is


def test_the_example_producer_runs_from_its_registry_line(
    scratch: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = scratch / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{RECORDED}EOF\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(SystemExit):
        main(["produce", "smi", "--help"])
    assert "--command" in capsys.readouterr().out
    assert main(["produce", "smi", "--once", "--out", "-", "--command", str(fake)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["topic"] for r in rows] == [SAMPLES.name]
    sample = decode(SAMPLES, json.dumps(rows[0]["value"]))
    assert [g.activity for g in sample.gpus] == [0.87, None]
    assert sample.gpus[1].unsupported == ("utilization",)
    assert sample.gpus[0].model == "NVIDIA A100-SXM4-80GB"
    monkeypatch.setenv("GPUGAP_SMI_COMMAND", str(scratch / "absent"))
    assert main(["produce", "smi", "--once", "--out", "-"]) == 2
    assert "GPUGAP_SMI_COMMAND" in capsys.readouterr().err  # says what to fix


def test_the_example_sink_stores_a_batch(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUGAP_JSONL_PATH", str(scratch / "out.jsonl"))
    spec = sinks.plugin("jsonl")
    sink = spec.load().from_settings(Settings(), spec.config(), max_records=10)
    assert [t.name for t in sink.topics] == [MINUTES.name]
    records = list(node_samples(3, nodes=1))  # any records: the sink stores what it is given
    asyncio.run(sink.write(records))
    stored = (scratch / "out.jsonl").read_text().splitlines()
    assert [decode(SAMPLES, line) for line in stored] == records
