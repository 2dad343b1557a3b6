import pytest

from gpugap.schemas import TOPICS, by_name
from gpugap.schemas.errors import UnknownTopic
from gpugap.schemas.examples import one_of_each


def test_topic_names_are_versioned_and_keys_follow_the_registry() -> None:
    examples = one_of_each()
    for name, topic in TOPICS.items():
        assert name.rsplit(".v", 1)[1].isdigit()
        assert topic.key_for(examples[name])
    assert TOPICS["gpu.samples.v1"].key_for(examples["gpu.samples.v1"]) == b"prod/node001"
    # everything that meets on one GPU is keyed by node
    assert TOPICS["gpu.allocations.v1"].partitioned_by == TOPICS["gpu.samples.v1"].partitioned_by


def test_lookup_strips_the_namespace_prefix() -> None:
    assert by_name("t1.gpu.samples.v1", "t1.") is TOPICS["gpu.samples.v1"]


def test_unknown_version_names_the_known_ones() -> None:
    with pytest.raises(UnknownTopic, match=r"'gpu\.samples\.v2'.*gpu\.samples\.v1"):
        by_name("gpu.samples.v2")
    with pytest.raises(UnknownTopic, match="known:"):
        by_name("weather.v1")
