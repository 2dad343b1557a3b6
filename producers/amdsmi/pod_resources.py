"""Which pod holds which AMD device: the kubelet's PodResources API, with AMD's device ids.

AMD's device plugin (ROCm/k8s-device-plugin ``internal/pkg/amdgpu/amdgpu.go`` GetAMDGPUs)
names a GPU by its PCI address (``0000:19:00.0``, the directory under
``/sys/module/amdgpu/drivers/pci:amdgpu/``) and, in DPX/QPX/CPX, every further partition
by its platform device (``amdgpu_xcp_30``, ``/sys/devices/platform/amdgpu_xcp_30``). The
kubelet hands those ids back per container. Here they are translated to gpugap's device
identities before the NVML agent's ``attributions`` (one holder, others sharing) is applied:

- a PCI address: the device amdsmi reports at that BDF (a whole GPU, or partition 0);
- ``amdgpu_xcp_N``: its DRM render node (``.../amdgpu_xcp_N/drm/renderD<minor>``) is the
  ``drm_render_minor`` of one KFD topology node, and amdsmi's ``kfd_info.node_id`` says
  which handle that node is.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpugap.producers.amdsmi.sampler import Device
from gpugap.producers.nvml.pod_resources import PodResourcesClient, attributions
from gpugap.schemas import Attribution

log = logging.getLogger(__name__)

_RENDER_MINOR = re.compile(r"^drm_render_minor\s+(\d+)\s*$", re.MULTILINE)
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def device_names(devices: Iterable[Device], sys_root: Path = Path("/sys")) -> dict[str, str]:
    """The AMD device plugin's device id -> gpugap identity, for the devices amdsmi sees."""
    devices = list(devices)
    out: dict[str, str] = {}
    for d in devices:  # partition 0 first: a GPU's PCI address names its first partition
        if _BDF.match(d.bdf) and (d.partition is None or d.partition.partition_id == 0):
            out.setdefault(d.bdf, d.identity)
    by_node = {d.kfd_node: d.identity for d in devices if d.kfd_node is not None}
    if not by_node:
        return out
    for xcp in sorted((sys_root / "devices" / "platform").glob("amdgpu_xcp_*")):
        minor = next((int(r.name[7:]) for r in (xcp / "drm").glob("renderD*")), None)
        if minor is None:
            continue
        for node, identity in by_node.items():
            props = sys_root / "class" / "kfd" / "kfd" / "topology" / "nodes" / str(node)
            try:
                text = (props / "properties").read_text(errors="replace")[:65536]
            except OSError:
                continue
            found = _RENDER_MINOR.search(text)
            if found and int(found.group(1)) == minor:
                out[xcp.name] = identity
    return out


def translate(response: Any, names: Mapping[str, str]) -> Any:
    """The response with AMD device ids replaced by identities (others left out)."""
    pods = []
    for pod in response.pod_resources:
        containers = []
        for c in pod.containers:
            ids = [
                names[i.lower()] for dev in c.devices for i in dev.device_ids if i.lower() in names
            ]
            containers.append(
                SimpleNamespace(name=c.name, devices=[SimpleNamespace(device_ids=ids)])
            )
        pods.append(SimpleNamespace(name=pod.name, namespace=pod.namespace, containers=containers))
    return SimpleNamespace(pod_resources=pods)


class AmdPodResources(PodResourcesClient):
    """The NVML agent's client (one lazily opened channel, one warning per outage), answering
    by AMD identity."""

    async def holders(self, names: Mapping[str, str]) -> dict[str, Attribution] | None:
        response = await self.raw()
        return None if response is None else attributions(translate(response, names), self._capped)
