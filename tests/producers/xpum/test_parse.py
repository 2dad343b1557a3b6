"""XPU Manager exporter text -> node samples, exactly.

Fixtures (tests/fixtures/intel/SOURCES.md):
- ``xpum_exporter_max1550_2tile_RECONSTRUCTED.prom``: RECONSTRUCTED, not recorded: Intel's
  own 1.x exporter code (xpumanager@master 57e44f55) run against a stub core with invented
  values (tile compute 80 % and 20 %, copy 5 % and 0 %, memory 32 and 8 GiB, power 230.25 and
  180.25 W, device 410.5 W, energy 1234.567 J, node-a, pod ml/train-0/main).
- ``xpum_per_engine_ratio_flex140_issue112.prom``: recorded, intel/xpumanager issue #112
  (2025-10-08), a Flex 140's per-engine rows with the exporter's duplicated series.
The 2.x texts come from tests/harness/xpum_text.py (xpumd's code: no recorded 2.x scrape).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpugap.producers.xpum.parse import ScrapeError, XpumScrape, parse_scrape
from gpugap.schemas import Attribution, DevicePartition, GpuSample, NodeSample
from gpugap.schemas.types import ActivityMetric, DeadLetterKind, PartitionKind, SampleSource, Vendor
from tests.harness.device_state import DeviceState, Holder
from tests.harness.xpum_text import xpum_v1_text, xpum_v2_text

FIXTURES = Path(__file__).parents[2] / "fixtures" / "intel"
RECONSTRUCTED = (FIXTURES / "xpum_exporter_max1550_2tile_RECONSTRUCTED.prom").read_text()
ISSUE112 = (FIXTURES / "xpum_per_engine_ratio_flex140_issue112.prom").read_text()
T = datetime(2026, 11, 2, 9, 30, 15, tzinfo=UTC)
UUID = "01000000-0000-0000-0000-000000000000"
MAX1550 = "Intel(R) Data Center GPU Max 1550"
COMPUTE, ALL = ActivityMetric.COMPUTE_ENGINE_GROUP, ActivityMetric.ALL_ENGINES
POD = Attribution(pod="train-0", namespace="ml", container="main")


def parse(text: str, *, tiles: bool = False) -> XpumScrape:
    return parse_scrape(
        text, cluster="c1", default_node="10.0.3.7", time=T, interval_s=15.0, tiles_as_devices=tiles
    )


def refused(text: str) -> ScrapeError:
    with pytest.raises(ScrapeError) as caught:
        parse(text)
    return caught.value


def card(n: int, uuid: str, tiles: tuple[float, ...] | None, **kw: object) -> DeviceState:
    values: dict[str, Any] = dict(
        node="xe-node-1",
        index=n,
        uuid=uuid,
        model=MAX1550,
        busy=sum(tiles) / len(tiles) if tiles else 0.3,
        memory_used_mib=2048.0 * (n + 1),
        memory_total_mib=131072.0,
        power_w=300.0 + n,
        energy_j=1000.5 * (n + 1),
        pci_bdf=f"0000:{0x18 + n * 0x10:02x}:00.0",
        tile_busy=tiles,
    )
    return DeviceState(**(values | kw))


def test_reconstructed_2_tile_card_is_one_device() -> None:
    scrape = parse(RECONSTRUCTED)
    assert (scrape.family, scrape.duplicates, scrape.discarded_power) == ("1.x", 0, [])
    assert scrape.samples == [
        NodeSample(
            cluster="c1",
            node="node-a",
            time=T,
            source=SampleSource.XPUM,
            interval_s=15.0,
            gpus=(
                GpuSample(
                    uuid=f"XPU-{UUID}",
                    index=0,
                    model=MAX1550,
                    vendor=Vendor.INTEL,
                    # the tiles' compute groups 0.8 and 0.2: the mean, not the copy group's 0.05
                    activity=0.5,
                    activity_metric=COMPUTE,
                    utilization=0.5,
                    memory_used_mib=32768.0 + 8192.0,
                    power_w=410.5,  # the device row, not the tiles' again
                    energy_mj=1234567,
                    unsupported=("memory_total_mib",),
                    attribution=POD,
                ),
            ),
        )
    ]


def test_reconstructed_card_as_tiles() -> None:
    [sample] = parse(RECONSTRUCTED, tiles=True).samples
    parent = f"XPU-{UUID}"
    expected = [
        GpuSample(
            uuid=f"{parent}/{tile}",
            index=tile,
            model=MAX1550,
            vendor=Vendor.INTEL,
            partition=DevicePartition(
                parent_uuid=parent, partition_id=tile, kind=PartitionKind.INTEL_TILE, count=2
            ),
            activity=busy,
            activity_metric=COMPUTE,
            utilization=busy,
            memory_used_mib=memory,
            power_w=power,
            unsupported=("memory_total_mib", "energy_mj"),  # 1.x: energy per GPU only
            attribution=POD,
        )
        for tile, busy, memory, power in ((0, 0.8, 32768.0, 230.25), (1, 0.2, 8192.0, 180.25))
    ]
    assert list(sample.gpus) == expected


def test_fallback_is_all_engines_never_other_groups() -> None:
    no_compute = "".join(
        line for line in RECONSTRUCTED.splitlines(keepends=True) if 'type="compute"' not in line
    )
    [sample] = parse(no_compute).samples
    [gpu] = sample.gpus
    assert (gpu.activity, gpu.activity_metric) == (0.5, ALL)  # xpum_engine_ratio, not copy


def test_percent_values_are_refused_with_the_reason() -> None:
    line = next(x for x in RECONSTRUCTED.splitlines() if 'sub_dev="0",type="compute"' in x)
    error = refused(RECONSTRUCTED.replace(line, line.removesuffix(" 0.8") + " 80.0"))
    assert error.kind is DeadLetterKind.SCHEMA
    assert "80.0" in error.reason and "percent" in error.reason


def test_a_repeated_series_keeps_the_last_value() -> None:
    # issue #112 shows the exporter printing one series twice; here the tile-0 compute row
    line = next(x for x in RECONSTRUCTED.splitlines() if 'sub_dev="0",type="compute"' in x)
    twice = RECONSTRUCTED + line.removesuffix(" 0.8") + " 0.6\n"
    scrape = parse(twice)
    assert scrape.duplicates == 1
    assert scrape.samples[0].gpus[0].activity == pytest.approx((0.6 + 0.2) / 2)


def test_recorded_issue112_scrape_is_refused_not_crashed() -> None:
    # recorded (issue #112): per-engine rows only, two of them the same series
    error = refused(ISSUE112)
    assert error.kind is DeadLetterKind.REJECTED and "XPU Manager" in error.reason


def test_impossible_power_is_dropped_and_reported() -> None:
    # issue #130: 3.69e12 W for one scrape after D3 -> D0
    line = next(x for x in RECONSTRUCTED.splitlines() if 'sub_dev="1",uuid' in x and "power" in x)
    scrape = parse(RECONSTRUCTED.replace(line, line.removesuffix(" 180.25") + " 3.69e12"))
    [gpu] = scrape.samples[0].gpus
    assert gpu.power_w is None and "power_w" in gpu.unsupported
    assert gpu.activity == 0.5 and gpu.energy_mj == 1234567  # the rest stands
    [note] = scrape.discarded_power
    assert "3690000000000.0 W" in note and 'sub_dev="1"' in note


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (f'uuid="{UUID}"', 'uuid="00000000-0000-0000-0000-000000000000"', "all zeros"),
        (f'uuid="{UUID}"', 'uuid="not-a-uuid"', "not a device UUID"),
        (f'uuid="{UUID}",', "", "no uuid label"),
        ('sub_dev="1"', 'sub_dev="one"', "tile is not a number"),
    ],
)
def test_unusable_identity_is_one_clear_refusal(old: str, new: str, says: str) -> None:
    error = refused(RECONSTRUCTED.replace(old, new))
    assert error.kind is DeadLetterKind.SCHEMA and says in error.reason


def test_truncated_and_garbage() -> None:
    assert refused(RECONSTRUCTED[:-40]).kind is DeadLetterKind.MALFORMED
    assert refused("<html>not metrics</html>\n").kind is DeadLetterKind.MALFORMED
    assert refused("").kind is DeadLetterKind.REJECTED


def test_fake_v1_round_trip_several_cards_in_pci_order() -> None:
    # listed out of PCI order: the indexes follow the PCI address
    cards = [
        card(1, "a2000000-0000-0000-0000-0000000000b2", (1.0, 0.0)),
        card(0, "a1000000-0000-0000-0000-0000000000b1", (0.25, 0.75)),
        card(2, "a3000000-0000-0000-0000-0000000000b3", None),  # no tiles
    ]
    [sample] = parse(xpum_v1_text(cards)).samples
    assert sample.node == "xe-node-1"
    got = [(g.uuid[4:12], g.index, g.activity, g.memory_used_mib, g.power_w) for g in sample.gpus]
    assert got == [
        ("a1000000", 0, 0.5, 2048.0, 300.0),
        ("a2000000", 1, 0.5, 4096.0, 301.0),
        ("a3000000", 2, 0.3, 6144.0, 302.0),
    ]
    assert [g.energy_mj for g in sample.gpus] == [1000500, 2001000, 3001500]
    flat = parse(xpum_v1_text(cards), tiles=True).samples[0].gpus
    # tiles: card index x tiles + tile; the tile-less card is one device after them
    assert [(g.uuid[4:12], g.uuid[-2:], g.index, g.activity) for g in flat] == [
        ("a1000000", "/0", 0, 0.25),
        ("a1000000", "/1", 1, 0.75),
        ("a2000000", "/0", 2, 1.0),
        ("a2000000", "/1", 3, 0.0),
        ("a3000000", "b3", 4, 0.3),
    ]
    assert flat[-1].partition is None


def test_fake_v1_shape_is_the_reconstructed_one() -> None:
    state = card(
        0,
        UUID,
        (0.8, 0.2),
        node="node-a",
        pci_bdf="0000:29:00.0",
        holders=(Holder("ml", "train-0", "main", "uid-1"),),
    )

    def skeleton(text: str) -> list[str]:  # every line without its value
        return [x if x.startswith("#") else x.rsplit(" ", 1)[0] for x in text.splitlines()]

    assert skeleton(xpum_v1_text([state])) == skeleton(RECONSTRUCTED)


def test_v2_card_tiles_and_identity() -> None:
    cards = [card(0, "B1000000-0000-0000-0000-0000000000C1", (0.9, 0.1))]
    text = xpum_v2_text(cards)
    scrape = parse(text)
    assert scrape.family == "2.x"
    [gpu] = scrape.samples[0].gpus
    assert gpu.uuid == "XPU-b1000000-0000-0000-0000-0000000000c1"  # lower-case, as spec'd
    assert (gpu.activity, gpu.activity_metric, gpu.utilization) == (0.5, COMPUTE, 0.5)
    assert (gpu.memory_used_mib, gpu.memory_total_mib) == (2048.0, 131072.0)
    assert (gpu.power_w, gpu.energy_mj, gpu.model) == (300.0, 1000500, MAX1550)  # the card row
    tiles = parse(text, tiles=True).samples[0].gpus
    assert [(g.activity, g.memory_total_mib, g.power_w, g.energy_mj) for g in tiles] == [
        (0.9, 65536.0, 150.0, None),
        (0.1, 65536.0, 150.0, None),
    ]
    assert all(g.partition and g.partition.count == 2 for g in tiles)


def test_v2_several_compute_series_of_a_tile_are_averaged() -> None:
    text = xpum_v2_text([card(0, "b1000000-0000-0000-0000-0000000000c1", (0.9, 0.1))])
    extra = next(x for x in text.splitlines() if "engine-1-compute-all" in x)
    text += extra.replace("engine-1-", "engine-9-").removesuffix(" 0.9") + " 0.5\n"
    [tile0, _] = parse(text, tiles=True).samples[0].gpus
    assert tile0.activity == pytest.approx(0.7)


def test_v2_without_hw_id_is_one_clear_refusal() -> None:
    text = xpum_v2_text([card(0, "b1000000-0000-0000-0000-0000000000c1", None)])
    error = refused(text.replace('hw_id="b1000000-0000-0000-0000-0000000000c1",', ""))
    assert error.kind is DeadLetterKind.SCHEMA and "no hw_id label" in error.reason
    hexed = text.replace("b1000000-0000-0000-0000-0000000000c1", "b1" + "0" * 29 + "1")
    assert parse(hexed).samples[0].gpus[0].uuid == "XPU-b1000000-0000-0000-0000-000000000001"
