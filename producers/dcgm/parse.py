"""dcgm-exporter's Prometheus text -> node samples (pure: no I/O).

Parsing is prometheus_client's own parser; this module only maps DCGM fields and labels:

- one GPU per ``UUID`` (``uuid`` in some builds) and, for MIG, per ``GPU_I_ID``; dcgm-exporter
  labels a MIG instance with its parent's UUID, so the instance is named
  ``MIG-<parent uuid>/<GPU_I_ID>/0`` (DESIGN.md: parent UUID + instance id) and carries
  ``mig`` with the profile from ``GPU_I_PROFILE``. On a GPU with instances, series without
  ``GPU_I_ID`` describe the whole board and are not a device of their own.
- node from ``Hostname`` (``hostname`` in newer builds), else the endpoint's host.
- activity: ``PROF_SM_ACTIVE``, else ``PROF_GR_ENGINE_ACTIVE``, else ``GPU_UTIL`` / 100.
- attribution: ``pod``/``namespace``/``container`` (or the old ``pod_name``/``pod_namespace``/
  ``container_name``), and ``hpc_job`` as the Slurm job. A time-sliced GPU that dcgm-exporter
  reports once per pod holding it (``--kubernetes-virtual-gpus``: the same series with each
  pod's labels and a ``vgpu`` label) is one device: the first pod in (namespace, pod,
  container) order is its pod, the other pods its ``shared`` (sorted, one entry per pod with
  its first container, at most MAX_SHARING_PODS), as the NVML agent does from the kubelet.
- measured use per pod: dcgm-exporter >= 4.8.2 rows labelled ``pod_uid`` carry the pod's own
  GPU_UTIL and FB_USED (``producers/dcgm/per_pod.py``); the row without pod labels is the
  device's value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from gpugap.producers.dcgm.per_pod import PER_POD_FIELDS, PodRow, add_row, measured_use
from gpugap.producers.prometheus.text import ScrapeError, check_complete, scrape_series
from gpugap.schemas import Attribution, GpuSample, MigInstance, NodeSample, SharingPod
from gpugap.schemas.types import (
    GPU_UUID_PATTERN,
    MAX_SHARING_PODS,
    ActivityMetric,
    DeadLetterKind,
    SampleSource,
)

#: DCGM field -> our name for it
FIELDS = {
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_active",
    "DCGM_FI_DEV_GPU_UTIL": "util",
    "DCGM_FI_DEV_FB_USED": "fb_used",
    "DCGM_FI_DEV_FB_FREE": "fb_free",
    "DCGM_FI_DEV_FB_RESERVED": "fb_reserved",
    "DCGM_FI_DEV_FB_TOTAL": "fb_total",
    "DCGM_FI_DEV_POWER_USAGE": "power",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock",
}
SAMPLE_FIELDS = (
    "activity",
    "utilization",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "energy_mj",
    "sm_clock_mhz",
)
_WANTED = tuple(FIELDS)


@dataclass
class _Gpu:
    node: str
    uuid: str
    index: int
    gi: int | None
    labels: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)
    #: (namespace, pod, container) of every pod a series of this GPU is labelled with
    pods: set[tuple[str, str, str]] = field(default_factory=set)
    #: pod UID -> its own values (dcgm-exporter >= 4.8.2 per-pod rows)
    pod_rows: dict[str, PodRow] = field(default_factory=dict)


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def _ratio(value: float) -> float:
    # DCGM's ratios can overshoot by float rounding; anything further off is a real error
    return min(1.0, max(0.0, value)) if -1e-3 <= value <= 1.0 + 1e-3 else value


def parse_scrape(
    text: str, *, cluster: str, default_node: str, time: datetime, interval_s: float | None
) -> list[NodeSample]:
    """One node sample per node found in the scrape (normally one). Raises ScrapeError."""
    check_complete(text)
    series = scrape_series(text, lambda line: line.startswith(_WANTED))
    try:
        return node_samples(
            series, cluster=cluster, default_node=default_node, time=time, interval_s=interval_s
        )
    except ScrapeError as exc:
        if exc.kind is not DeadLetterKind.REJECTED:  # REJECTED: no GPU series at all
            raise
        scrape_series(text)  # nothing of ours: is the rest valid text format at all? (rare)
        raise


def node_samples(
    series: Iterable[tuple[str, Mapping[str, str], float]],
    *,
    cluster: str,
    default_node: str,
    time: datetime,
    interval_s: float | None,
) -> list[NodeSample]:
    """(metric name, labels, value) of DCGM series at one instant -> one node sample per node.

    Shared by the live scraper (a scrape's samples) and the Prometheus backfill (the values
    Prometheus kept of the same series), so both name GPUs, MIG instances, nodes, activity and
    attribution alike. Raises ScrapeError."""
    gpus: dict[tuple[str, str, int | None], _Gpu] = {}
    for name, labels, value in series:
        # the parser renames counter samples to OpenMetrics' '<name>_total'
        ours = FIELDS.get(name) or FIELDS.get(name.removesuffix("_total"))
        if ours is None or math.isnan(value):
            continue
        uuid = _label(labels, "UUID", "uuid")
        if uuid is None:
            continue  # not a per-GPU series
        gi_text = labels.get("GPU_I_ID") or None
        try:
            gi = int(gi_text) if gi_text is not None else None
            index = int(labels.get("gpu", 0))
        except ValueError:
            raise ScrapeError(
                DeadLetterKind.SCHEMA, f"GPU {uuid}: gpu / GPU_I_ID labels are not numbers"
            ) from None
        node = _label(labels, "Hostname", "hostname") or default_node
        key = (node, uuid, gi)
        gpu = gpus.get(key)
        if gpu is None:
            gpu = gpus[key] = _Gpu(node, uuid, index, gi, dict(labels))
        pod = labels.get("pod") or labels.get("pod_name")
        ns = labels.get("namespace") or labels.get("pod_namespace") or ""
        pod_uid = labels.get("pod_uid")
        if pod_uid and ours in PER_POD_FIELDS:  # the pod's own value, not the device's
            add_row(gpu.pod_rows, pod_uid, pod=pod, namespace=ns, ours=ours, v=value)
        else:
            gpu.values.setdefault(ours, value)  # several hpc_job or pod series: the first
        if pod:
            gpu.pods.add((ns, pod, labels.get("container") or labels.get("container_name") or ""))
    if not gpus:
        raise ScrapeError(
            DeadLetterKind.REJECTED, "no DCGM GPU series in the scrape (is it dcgm-exporter?)"
        )
    partitioned = {(g.node, g.uuid) for g in gpus.values() if g.gi is not None}
    by_node: dict[str, list[GpuSample]] = {}
    what = "the scrape"
    try:
        for g in gpus.values():
            if g.gi is None and (g.node, g.uuid) in partitioned:
                continue  # the board of a MIG GPU: its instances are the devices
            what = f"GPU {g.index} ({g.uuid}{'' if g.gi is None else f' GI {g.gi}'})"
            by_node.setdefault(g.node, []).append(_sample(g))
        what = "the node sample"
        return [
            NodeSample(
                cluster=cluster,
                node=node,
                time=time,
                source=SampleSource.DCGM,
                interval_s=interval_s,
                gpus=tuple(sorted(samples, key=_order)),
            )
            for node, samples in by_node.items()
        ]
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors(include_url=False)[:5])
        raise ScrapeError(DeadLetterKind.SCHEMA, f"{what}: {problems}") from None


def _problem(e: Any) -> str:
    msg = e["msg"]
    if (
        e["type"] == "string_pattern_mismatch"
        and e.get("ctx", {}).get("pattern") == GPU_UUID_PATTERN
    ):
        msg = "should be a GPU UUID ('GPU-<uuid>')"
    return f"{'.'.join(map(str, e['loc'])) or '(record)'}: {msg} (got {e.get('input')!r})"


def _order(g: GpuSample) -> tuple[int, int, str]:
    return (g.index, g.mig.gpu_instance_id if g.mig else -1, g.uuid)


def pods_attribution(pods: set[tuple[str, str, str]], job: str | None) -> Attribution:
    """The first pod in (namespace, pod, container) order, the other pods as ``shared``
    (shared with the other exporter scrapers: one rule for a GPU several pods hold)."""
    who = sorted(pods)
    if not who:
        return Attribution(slurm_job_id=job)
    ns, pod, container = who[0]
    others: dict[tuple[str, str], str] = {}
    for o_ns, o_pod, o_container in who:
        if (o_ns, o_pod) != (ns, pod):
            others.setdefault((o_ns, o_pod), o_container)  # sorted: the pod's first container
    shared = tuple(
        SharingPod(pod=o_pod, namespace=o_ns or None, container=o_container or None)
        for (o_ns, o_pod), o_container in list(others.items())[:MAX_SHARING_PODS]
    )
    return Attribution(
        pod=pod,
        namespace=ns or None,
        container=container or None,
        slurm_job_id=job,
        shared=shared or None,
    )


def _sample(g: _Gpu) -> GpuSample:
    v = g.values
    out: dict[str, Any] = {}
    if "sm_active" in v:
        out.update(activity=_ratio(v["sm_active"]), activity_metric=ActivityMetric.SM_ACTIVE)
    elif "gr_active" in v:
        out.update(activity=_ratio(v["gr_active"]), activity_metric=ActivityMetric.GR_ENGINE_ACTIVE)
    if "util" in v:
        out["utilization"] = _ratio(v["util"] / 100)
        if "activity" not in out:
            out.update(activity=out["utilization"], activity_metric=ActivityMetric.UTILIZATION)
    if "fb_used" in v:
        out["memory_used_mib"] = float(v["fb_used"])
    if "fb_total" in v:
        out["memory_total_mib"] = float(v["fb_total"])
    elif "fb_used" in v and "fb_free" in v:
        out["memory_total_mib"] = float(v["fb_used"] + v["fb_free"] + v.get("fb_reserved", 0.0))
    if "power" in v:
        out["power_w"] = float(v["power"])
    if "energy" in v:
        out["energy_mj"] = round(v["energy"])
    if "sm_clock" in v:
        out["sm_clock_mhz"] = round(v["sm_clock"])
    labels = g.labels
    mig = None
    uuid = g.uuid
    if g.gi is not None:
        mig = MigInstance(
            parent_uuid=g.uuid, gpu_instance_id=g.gi, profile=labels.get("GPU_I_PROFILE") or None
        )
        uuid = f"MIG-{g.uuid}/{g.gi}/0"
    job = labels.get("hpc_job") or None
    attribution = pods_attribution(g.pods, job) if g.pods or job else None
    return GpuSample(
        uuid=uuid,
        index=g.index,
        model=labels.get("modelName") or None,
        mig=mig,
        unsupported=tuple(f for f in SAMPLE_FIELDS if f not in out),
        attribution=attribution,
        measured_use=measured_use(g.pod_rows, v, mig=g.gi is not None),
        **out,
    )
