"""Which pod holds which GPU: the kubelet's PodResources API (v1 ``List``) on its unix socket.

The kubelet answers with every pod on the node and, per container, the devices the device
plugins handed out. For NVIDIA's plugin the device ids of ``nvidia.com/gpu`` and
``nvidia.com/mig-*`` are GPU or MIG UUIDs, with a ``::N`` suffix when the plugin time-slices
a GPU (several pods then share one UUID). Rather than trusting resource names (clusters
rename them: ``nvidia.com/gpu.shared``, ``nvidia.com/mig-1g.10gb``...), every device id that
is a GPU or MIG UUID is taken.

Read-only: ``List`` is the only call made. A missing socket means "not a Kubernetes node"
(no attribution, no noise); a socket that fails to answer is logged once per outage.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpugap.schemas import Attribution, SharingPod
from gpugap.schemas.types import GPU_UUID_PATTERN, MAX_SHARING_PODS

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
_UUID = re.compile(GPU_UUID_PATTERN)
#: the gRPC method path: package v1, service PodResourcesLister (upstream's api.proto)
LIST_METHOD = "/v1.PodResourcesLister/List"


def device_uuid(device_id: str) -> str | None:
    """A device id as the GPU/MIG UUID it names, or None for other kinds of devices."""
    uuid = device_id.split("::", 1)[0]  # time-slicing replicas: 'GPU-...::3'
    return uuid if _UUID.match(uuid) else None


def attributions(response: Any, capped: set[str] | None = None) -> dict[str, Attribution]:
    """UUID -> the pod and container holding it, from a ListPodResourcesResponse.

    A time-sliced GPU held by several pods is attributed to the first in (namespace, pod,
    container) order, so the choice is stable from tick to tick; the other pods go in
    ``shared``, sorted, one entry per pod (its first container holding the GPU), at most
    MAX_SHARING_PODS of them. A pod holding several replicas of one GPU is one holder; a GPU
    held by one pod has ``shared=None``.

    ``capped``: the GPUs that already held too many pods, kept by the caller so that the
    warning comes once when a GPU goes past the cap rather than every tick; updated in place.
    """
    holders: dict[str, set[tuple[str, str, str]]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                for device_id in dev.device_ids:
                    uuid = device_uuid(device_id)
                    if uuid is not None:
                        holders.setdefault(uuid, set()).add(
                            (pod.namespace, pod.name, container.name)
                        )
    out: dict[str, Attribution] = {}
    over: set[str] = set()
    for uuid, found in holders.items():
        who = sorted(found)
        ns, pod_name, container = who[0]
        others: dict[tuple[str, str], str] = {}
        for o_ns, o_pod, o_container in who:
            if o_pod and (o_ns, o_pod) != (ns, pod_name):
                others.setdefault((o_ns, o_pod), o_container)  # sorted: the pod's first
        if len(others) > MAX_SHARING_PODS:
            over.add(uuid)
            if capped is None or uuid not in capped:
                log.warning(
                    "pod-resources: %s is held by %d pods; kept %d (the first and %d sharing "
                    "it), the others are not attributed",
                    uuid,
                    len(others) + 1,
                    MAX_SHARING_PODS + 1,
                    MAX_SHARING_PODS,
                )
        shared = tuple(
            SharingPod(pod=o_pod, namespace=o_ns or None, container=o_container or None)
            for (o_ns, o_pod), o_container in list(others.items())[:MAX_SHARING_PODS]
        )
        out[uuid] = Attribution(
            pod=pod_name or None,
            namespace=ns or None,
            container=container or None,
            shared=shared or None,
        )
    if capped is not None:
        capped.clear()  # a GPU back under the cap is warned about again if it goes over
        capped.update(over)
    return out


class PodResourcesClient:
    """A grpc.aio channel to the kubelet, opened lazily and kept while it works."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel: Any = None
        self._stub: Any = None
        self._failing = False
        self._capped: set[str] = set()  # GPUs held by more pods than kept: warned

    async def list(self) -> dict[str, Attribution] | None:
        """UUID -> holder, or None when the kubelet cannot be asked (no socket, no answer)."""
        response = await self.raw()
        return None if response is None else attributions(response, self._capped)

    async def raw(self) -> Any:
        """The kubelet's List answer as it is (device ids as its device plugins give them),
        or None when it cannot be asked."""
        import grpc

        if not self.socket.exists():
            return None
        if self._stub is None:
            from gpugap.producers.nvml.kubelet import api_pb2_grpc

            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket.absolute()}")
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        from gpugap.producers.nvml.kubelet import api_pb2

        try:
            response = await self._stub.List(
                api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            if not self._failing:
                log.warning(
                    "pod-resources: List on %s failed (%s: %s); samples carry no pod until it "
                    "answers",
                    self.socket,
                    exc.code().name,
                    exc.details(),
                )
            self._failing = True
            await self.close()  # a restarted kubelet makes a new socket: reconnect next time
            return None
        if self._failing:
            log.warning("pod-resources: %s answers again", self.socket)
            self._failing = False
        return response

    async def close(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()


def lookup(holders: Mapping[str, Attribution], uuid: str, mig: Any) -> Attribution | None:
    """The holder of a device by its UUID, or for MIG by the older 'MIG-GPU-<uuid>/gi/ci' id."""
    found = holders.get(uuid)
    if found is None and mig is not None:
        ci = mig.compute_instance_id or 0
        found = holders.get(f"MIG-{mig.parent_uuid}/{mig.gpu_instance_id}/{ci}")
    return found
