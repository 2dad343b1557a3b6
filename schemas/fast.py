"""Building records the stream computed, without validating them again.

:func:`trusted` makes a model instance from values that are already valid, without pydantic's
validation (~25 us for a ``GpuMinute`` on the 2-core machine the README's figures come from;
this ~2 us). Only for values a pure step computed from validated records, the caller
guaranteeing what validation would have checked (tests/streams/test_fast_paths.py validates
every row of a simulated estate again and compares).

Measured and left with pydantic: a Python decoder that checks every field of an 8-GPU node
sample and builds its models took ~85 us against pydantic-core's ~50 us, and a Python JSON
writer for ``GpuMinute`` ~17 us against the serializer's ~15 us.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

B = TypeVar("B", bound=BaseModel)

_set = object.__setattr__


def trusted(cls: type[B], values: dict[str, Any]) -> B:
    """``cls`` holding ``values`` (every field, valid, in the field types), not validated."""
    m = cls.__new__(cls)
    _set(m, "__dict__", values)
    _set(m, "__pydantic_fields_set__", set(values))
    _set(m, "__pydantic_extra__", None)
    _set(m, "__pydantic_private__", None)
    return m
