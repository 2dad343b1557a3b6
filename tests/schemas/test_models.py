from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from gpugap.schemas import TOPICS, GpuMinute, GpuSample, NodeSample, decode, encode
from gpugap.schemas.errors import MalformedRecord, SchemaViolation
from gpugap.schemas.examples import gpu_uuid, node_samples, one_of_each
from gpugap.schemas.topics import SAMPLES

UUID = gpu_uuid("n", 0)


def sample_json(**gpu: object) -> bytes:
    base = next(node_samples(1, gpus=1)).model_dump(mode="json")
    base["gpus"][0].update(gpu)
    import json

    return json.dumps(base).encode()


@pytest.mark.parametrize("name", list(TOPICS))
def test_every_topic_round_trips_through_the_codec(name: str) -> None:
    record = one_of_each()[name]
    assert decode(TOPICS[name], encode(record)) == record


def test_times_are_utc_with_millisecond_precision() -> None:
    plus2 = timezone(timedelta(hours=2))
    s = NodeSample(
        cluster="c",
        node="n",
        source="nvml",
        gpus=(),
        time=datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=plus2),
    )
    assert s.time == datetime(2026, 1, 1, 10, 0, 0, 123000, tzinfo=UTC)
    assert b'"time":"2026-01-01T10:00:00.123Z"' in encode(s)


@pytest.mark.parametrize(
    ("payload", "field", "words"),
    [
        (sample_json(activity=1.5), "gpus.0.activity", "less than or equal to 1"),
        (sample_json(activity=-0.1), "gpus.0.activity", "greater than or equal to 0"),
        (sample_json(activity="0.5"), "gpus.0.activity", "valid number"),
        (sample_json(index=-1), "gpus.0.index", "greater than or equal to 0"),
        (sample_json(power_w=-3.0), "gpus.0.power_w", "greater than or equal to 0"),
        (sample_json(uuid="GPU-0"), "gpus.0.uuid", "GPU UUID"),
        (sample_json(activity_metric="magic"), "gpus.0.activity_metric", "sm_active"),
        (sample_json(activity_metric=None), "gpus.0", "activity_metric is required"),
    ],
)
def test_invalid_values_are_rejected_naming_the_field(
    payload: bytes, field: str, words: str
) -> None:
    with pytest.raises(SchemaViolation) as err:
        decode(SAMPLES, payload)
    assert f"{field}: " in err.value.reason
    assert words in err.value.reason


def test_naive_timestamp_is_rejected() -> None:
    payload = encode(next(node_samples(1))).replace(b'.000Z"', b'.000"')
    with pytest.raises(SchemaViolation, match=r"time: .*timezone-aware"):
        decode(SAMPLES, payload)


def test_not_json_is_malformed() -> None:
    with pytest.raises(MalformedRecord, match="not valid JSON"):
        decode(SAMPLES, b'{"cluster": ')
    with pytest.raises(MalformedRecord, match="empty"):
        decode(SAMPLES, None)


def test_mig_uuids_in_both_driver_formats_are_accepted() -> None:
    hexpart = UUID[4:]
    for uuid in (f"MIG-{hexpart}", f"MIG-GPU-{hexpart}/1/0"):
        assert GpuSample(uuid=uuid, index=0).uuid == uuid


def test_duplicate_gpus_in_one_node_sample_are_rejected() -> None:
    g = GpuSample(uuid=UUID, index=0)
    with pytest.raises(ValidationError, match="once per node sample"):
        NodeSample(cluster="c", node="n", time=datetime.now(UTC), source="nvml", gpus=(g, g))


def test_names_used_in_keys_cannot_contain_slashes() -> None:
    with pytest.raises(ValidationError, match="node"):
        NodeSample(cluster="c", node="a/b", time=datetime.now(UTC), source="nvml", gpus=())


def test_gpu_minute_must_be_aligned_and_not_consume_more_than_allocated() -> None:
    good = one_of_each()["gpu.minutes.v1"]
    with pytest.raises(ValidationError, match="aligned"):
        GpuMinute.model_validate({**good.model_dump(), "minute": good.minute.replace(second=5)})
    with pytest.raises(ValidationError, match="cannot exceed"):
        GpuMinute.model_validate({**good.model_dump(), "allocated_s": 10.0, "consumed_gpu_s": 20.0})


def test_records_are_immutable() -> None:
    s = next(node_samples(1))
    with pytest.raises(ValidationError):
        s.node = "other"  # type: ignore[misc]


def test_unknown_extra_fields_are_ignored_for_forward_compatibility() -> None:
    payload = encode(next(node_samples(1)))[:-1] + b',"added_in_a_later_release":1}'
    assert decode(SAMPLES, payload).node == "node000"
