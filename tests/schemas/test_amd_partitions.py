"""An AMD compute partition's count: the mode's, or for CPX the model's XCDs (ROCm's
partition.md as tests/fixtures/amd/NOTES.md quotes it)."""

from __future__ import annotations

import pytest

from gpugap.schemas.shares import amd_partition_count, amd_xcds_of

MI300X = "AMD Instinct MI300X OAM"  # DME card_series, recorded (NOTES.md section 3)
MI300X_VF = "Aqua Vanjaram [Instinct MI300X VF]"  # DME issue 171


@pytest.mark.parametrize(
    ("mode", "model", "count"),
    [
        ("spx", MI300X, 1),
        ("DPX", MI300X, 2),
        ("qpx", MI300X, 4),
        ("cpx", MI300X, 8),
        ("cpx", MI300X_VF, 8),
        ("CPX", "AMD Instinct MI325X", 8),
        ("CPX", "AMD Instinct MI355X", 8),
        ("CPX", "AMD Instinct MI300A", 6),
        ("TPX", "AMD Instinct MI300A", 3),
        ("DPX", None, 2),  # the mode alone says it
        ("QPX", "102-G30211-0C", 4),  # a part number: the mode still says it
    ],
)
def test_count_from_mode_and_model(mode: str, model: str | None, count: int) -> None:
    assert amd_partition_count(mode, model) == count


@pytest.mark.parametrize(
    ("mode", "model"),
    [
        ("CPX", None),  # CPX needs the model's XCDs
        ("CPX", "102-G30213-0C"),  # a part number names no model here
        ("CPX", "AMD Instinct MI210"),  # no compute partitions known for it
        ("TPX", MI300X),  # 8 XCDs do not split in 3 (partition.md: no TPX on MI300X)
        ("QPX", "AMD Instinct MI300A"),  # 6 XCDs do not split in 4
        ("none", MI300X),  # MI250X's DME label: not a mode
        ("", MI300X),
        (None, MI300X),
    ],
)
def test_unknown_is_none_never_a_guess(mode: str | None, model: str | None) -> None:
    assert amd_partition_count(mode, model) is None


def test_xcds_by_market_name() -> None:
    assert amd_xcds_of("MI300X-O") == 8  # amd-smi's market name on the blog's node
    assert amd_xcds_of("amd instinct mi300a") == 6
    assert amd_xcds_of("AMD Instinct MI3000X") is None  # a word, not a prefix
    assert amd_xcds_of(None) is None
