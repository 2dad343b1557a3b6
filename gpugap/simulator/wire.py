"""Node samples as JSON bytes without pydantic, byte-identical to ``schemas.codec.encode``.

Encoding a NodeSample model costs ~30 us per 8-GPU node here, a third of the budget for
100,000 GPU samples/s. Each GPU's JSON depends only on (device, holding, activity), so it is
built once per distinct value and reused; a node sample is then a join of cached fragments.
Field order, ``exclude_none`` and float formatting follow the models exactly (Python's
``repr`` of a float and pydantic's serializer agree on the values produced here: activity in
thousandths, power in tenths of a watt, whole MiB); tests/producers/test_simulate.py proves
byte identity against the codec on every sample of a scenario.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpugap.schemas.types import ActivityMetric, format_utc
from gpugap.simulator.estate import Device, Node
from gpugap.simulator.plan import Holding


def gpu_json(d: Device, h: Holding | None, a: int) -> bytes:
    """One GpuSample at activity ``a`` (thousandths) while ``h`` holds the device."""
    parts = [d.head, f',"activity":{a / 1000!r},"activity_metric":"{d.metric.value}"'.encode()]
    if not d.is_mig:  # NVML has no utilization or power per MIG instance
        if d.metric is ActivityMetric.UTILIZATION:
            util = a
        else:  # GPU_UTIL counts any kernel running: above SM activity, whole percent
            util = min(1000, (a * 5 // 4 + 5) // 10 * 10)
        parts.append(f',"utilization":{util / 1000!r}'.encode())
    mem = h.memory_mib if h is not None else 0.0
    parts.append(f',"memory_used_mib":{mem!r},"memory_total_mib":{d.memory_mib!r}'.encode())
    if d.is_mig:
        parts.append(b',"unsupported":["utilization","power_w"]')
    else:
        power = round((d.idle_w + (d.max_w - d.idle_w) * a / 1000) * 10)
        parts.append(f',"power_w":{power / 10!r},"unsupported":[]'.encode())
    if h is not None:
        parts.append(h.attribution)
    parts.append(b"}")
    return b"".join(parts)


class NodeWire:
    """The static parts of one node's samples."""

    __slots__ = ("head", "key", "mid")

    def __init__(self, node: Node) -> None:
        self.key = f"{node.cluster}/{node.name}".encode()
        self.head = f'{{"cluster":"{node.cluster}","node":"{node.name}","time":"'.encode()
        self.mid = f'","source":"simulator","interval_s":{float(node.interval)!r},"gpus":['.encode()


class Clock:
    """Relative seconds -> the wire time text, cached (many nodes sample in the same second)."""

    def __init__(self, origin: datetime) -> None:
        self.origin = origin
        self.origin_ms = int(origin.timestamp() * 1000)
        self._text: dict[int, bytes] = {}

    def text(self, t: int) -> bytes:
        got = self._text.get(t)
        if got is None:
            if len(self._text) > 100_000:
                self._text.clear()
            got = self._text[t] = format_utc(self.origin + timedelta(seconds=t)).encode()
        return got
