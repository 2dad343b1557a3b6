"""A fake Intel XPU Manager exporter: DeviceState -> the /metrics text it would serve.

``xpum_v1_text`` prints the 1.x exporter's shape (``xpum_*``) exactly as
tests/fixtures/intel/xpum_exporter_max1550_2tile_RECONSTRUCTED.prom has it: that file is
Intel's own exporter code (xpumanager@master 57e44f55, ``rest/prometheus_exporter``) run
against a stub core, so the label sets, label order (sorted, as prometheus_client prints
them), ``src``/``sub_dev``/``card`` rows, HELP/TYPE block, number format and line order
(sorted) are Intel's. It is RECONSTRUCTED, not recorded: no full recorded 1.x scrape exists
(tests/fixtures/intel/SOURCES.md). A state without ``tile_busy`` prints device rows with no
``sub_dev`` (unverified: the fixture only has a 2-tile card).

``xpum_v2_text`` prints the 2.x (``xpumd``, OpenTelemetry) shape from xpumanager@v2.x
``xpumd/receiver/intelxpu/sysman/documentation.md`` and its ``engine.go``, ``memory.go``,
``power.go`` and ``device.go`` (attribute names and values); no recorded 2.x scrape exists.
"""

from __future__ import annotations

from prometheus_client.utils import floatToGoString

from tests.harness.device_state import DeviceState

#: PCI device ids xpum prints as pci_dev (Max 1550 from the reconstruction, Flex 140 from
#: issue #112's scrape)
PCI_DEV = {
    "Intel(R) Data Center GPU Max 1550": "0xbd5",
    "Intel(R) Data Center GPU Flex 140": "0x56c1",
}
_MIB = 1 << 20
#: the reconstruction's _created value (the wall-clock time of its run)
CREATED = 1.7966431746957207e09

V1_HEADER = """\
# HELP xpum_energy_joules_total Total GPU energy consumption since boot (in Joules), per GPU
# TYPE xpum_energy_joules_total counter
# HELP xpum_energy_joules_created Total GPU energy consumption since boot (in Joules), per GPU
# TYPE xpum_energy_joules_created gauge
# HELP xpum_power_watts Avg GPU power (in watts), per GPU and per card
# TYPE xpum_power_watts gauge
# HELP xpum_engine_ratio GPU active time of the elapsed time (in %), per GPU tile
# TYPE xpum_engine_ratio gauge
# HELP xpum_engine_group_ratio Avg utilization of engine group (in %), per GPU tile
# TYPE xpum_engine_group_ratio gauge
# HELP xpum_memory_used_bytes Used GPU memory (in bytes), per GPU tile
# TYPE xpum_memory_used_bytes gauge
"""


def _line(name: str, labels: dict[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}} {floatToGoString(value)}"


def _tiles(state: DeviceState) -> tuple[float, ...] | None:
    return state.tile_busy if state.tile_busy and len(state.tile_busy) > 1 else None


def xpum_v1_text(states: list[DeviceState], *, with_node: bool = True) -> str:
    """The 1.x exporter's /metrics for these Intel cards (one node's exporter)."""
    lines = []
    for state in states:
        device = {
            "dev_file": f"card{state.index + 1}",
            "dev_name": state.model,
            "pci_bdf": state.pci_bdf,
            "pci_dev": PCI_DEV.get(state.model, "0x0"),
            "src": "direct",
            "uuid": state.uuid,
            "vendor": "Intel(R) Corporation",
        }
        if with_node:
            device["node"] = state.node
        if state.holders:  # the exporter maps one pod per BDF (the last one the kubelet lists)
            holder = state.holders[-1]
            device |= {
                "kube_container": holder.container,
                "kube_namespace": holder.namespace,
                "kube_pod": holder.pod,
            }
        lines.append(_line("xpum_energy_joules_created", device, CREATED))
        lines.append(_line("xpum_energy_joules_total", device, state.energy_j))
        lines.append(_line("xpum_power_watts", device, state.power_w))
        board = {"card": str(2147483649 + state.index), "src": "sum"}
        lines.append(
            _line(
                "xpum_power_watts",
                board | ({"node": state.node} if with_node else {}),
                state.power_w,
            )
        )
        tiles = _tiles(state)
        if tiles is None:  # no tiles: the device's own rows
            for group, value in (("compute", state.busy), ("copy", 0.0)):
                lines.append(_line("xpum_engine_group_ratio", device | {"type": group}, value))
            lines.append(_line("xpum_engine_ratio", device, state.busy))
            lines.append(_line("xpum_memory_used_bytes", device, state.memory_used_mib * _MIB))
            continue
        lines.append(_line("xpum_engine_ratio", device | {"src": "avg"}, sum(tiles) / len(tiles)))
        for t, busy in enumerate(tiles):
            tile = device | {"sub_dev": str(t)}
            for group, value in (("compute", busy), ("copy", 0.0)):
                lines.append(_line("xpum_engine_group_ratio", tile | {"type": group}, value))
            lines.append(_line("xpum_engine_ratio", tile, busy))
            share = state.memory_used_mib * _MIB / len(tiles)
            lines.append(_line("xpum_memory_used_bytes", tile, share))
            lines.append(_line("xpum_power_watts", tile, state.power_w / len(tiles)))
    return V1_HEADER + "".join(f"{line}\n" for line in sorted(lines))


def xpum_v2_text(states: list[DeviceState]) -> str:
    """xpumd 2.x's /metrics for these Intel cards (one node's xpumd)."""
    families: dict[str, list[str]] = {}

    def add(name: str, labels: dict[str, str], value: float) -> None:
        families.setdefault(name, []).append(_line(name, labels, value))

    for n, state in enumerate(states):
        tiles = _tiles(state)
        device = {"hw_id": state.uuid, "node": state.node, "pci_bdf": state.pci_bdf}
        add(
            "hw_gpu_info",
            device
            | {
                "com_intel_subdevice_count": str(len(tiles) if tiles else 0),
                "hw_gpu_type": "discrete",
                "hw_model": state.model,
                "hw_name": f"gpu-{n + 1}",
                "hw_serial_number": state.serial,
                "hw_vendor": "Intel(R) Corporation",
                "pci_device_id": PCI_DEV.get(state.model, "0x0").removeprefix("0x").zfill(4),
                "pci_vendor_id": "8086",
            },
            1,
        )
        power = device | {"com_intel_subdevice_id": "", "hw_name": "power-1"}
        add("hw_power_watts", power | {"hw_sensor_location": "card"}, state.power_w)
        add("hw_energy_joules_total", power | {"hw_sensor_location": "card"}, state.energy_j)
        places = [(str(t), busy) for t, busy in enumerate(tiles)] if tiles else [("", state.busy)]
        engine = 0
        for place, busy in places:
            on = device | {"com_intel_subdevice_id": place}
            for task, value in (("compute-all", busy), ("copy-all", 0.0), ("all", busy)):
                engine += 1
                group = {"hw_gpu_task": task, "hw_name": f"engine-{engine}-{task}"}
                add("hw_gpu_utilization_ratio", on | group, value)
            if tiles:  # each tile's own power domain beside the card's
                tile_power = on | {"hw_name": f"power-{int(place) + 2}"}
                tile_power |= {"hw_sensor_location": "package"}
                add("hw_power_watts", tile_power, state.power_w / len(places))
            mem = on | {"hw_memory_location": "device", "hw_memory_type": "hbm"}
            mem |= {"hw_name": f"mem-{int(place or 0) + 1}"}
            add("hw_memory_usage_bytes", mem, state.memory_used_mib * _MIB / len(places))
            add("hw_memory_size_bytes", mem, state.memory_total_mib * _MIB / len(places))
    text = []
    units = {"hw_gpu_info": "", "hw_energy_joules_total": "counter"}
    for name, rows in families.items():
        kind = "counter" if units.get(name) == "counter" else "gauge"
        family = name.removesuffix("_total")
        text.append(f"# HELP {family} {name} from xpumd\n# TYPE {family} {kind}\n")
        text.extend(f"{row}\n" for row in rows)
    return "".join(text)
