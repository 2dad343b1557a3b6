"""A small simulated estate with known watts and transfers, and the rate card it is priced
with: every expected figure in the tests is this card applied by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpugap.groundfloor.ratecard import RateCard
from gpugap.schemas.examples import gpu_uuid
from gpugap.schemas.models import GpuMinute, Record, Transfer

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
MIG = "MIG-" + gpu_uuid("cloud-mig-01", 0)[4:]
MIG_NO_SHARE = "MIG-" + gpu_uuid("edge-01", 0)[4:]

CARD: dict[str, Any] = {
    "name": "test card",
    "currency": "EUR",
    "clusters": {
        "hpc": {
            "environment": "onprem",
            "gpu_model": "H100",
            "nodes": [{"pattern": "hpc-a100-*", "gpu_model": "A100"}],
            "capital": {
                "H100": {"price": 30000, "years": 4, "residual": 3000},
                "A100": {"price": 12000, "years": 3},
            },
            "overhead_per_gpu_hour": 0.10,
            "kwh_price": 0.12,
            "pue": 1.25,
            "emission_g_per_kwh": 200,
            "egress_per_gib": {"onprem->cloud": 0.0},
        },
        "cloud": {
            "environment": "cloud",
            "gpu_model": "H100",
            "pricing": "on_demand",
            "nodes": [
                {"pattern": "cloud-l40s-*", "gpu_model": "L40S", "pricing": "reserved"},
                {"pattern": "cloud-mig-*", "gpu_model": "A100", "mig_profile": "3g.40gb"},
            ],
            "cloud": {
                "H100": {"on_demand": 6.0, "reserved": 4.0},
                "L40S": {"on_demand": 2.0, "reserved": 1.2},
                "A100": {"on_demand": 4.2},
            },
            "pue": 1.1,
            "emission_g_per_kwh": 400,
            "egress_per_gib": {"cloud->onprem": 0.09, "cloud->internet": 0.12},
        },
        # a MIG slice here has no share: 'no MIG share', not a whole GPU's price
        "edge": {
            "environment": "cloud",
            "gpu_model": "A100",
            "cloud": {"A100": {"on_demand": 4.2}},
        },
        # "lab" has no card: "no rate"
    },
}

# the rates by hand
H100_HPC = (30000 - 3000) / (4 * 8760) + 0.10  # per GPU-hour: amortised capital + overhead
A100_HPC = 12000 / (3 * 8760) + 0.10
HPC_KWH = 0.12 * 1.25  # per measured kWh: price x PUE
HPC_CO2 = 1.25 * 200 / 1000  # kg per measured kWh
CLOUD_CO2 = 1.1 * 400 / 1000
L40S = 1.2  # reserved
MIG_RATE = 4.2 * 3 / 7
H100_CLOUD = 6.0


def card() -> RateCard:
    return RateCard.model_validate(CARD)


def minute(  # noqa: PLR0917  (the estate reads as a table)
    cluster: str,
    node: str,
    gpu: str,
    m: int,
    alloc: str | None,
    consumed: float,
    watts: float | None,
    *,
    cls: str = "batch",
    team: str = "vision",
    measured: bool = True,
) -> GpuMinute:
    k8s = alloc is not None and alloc.startswith("k8s/")
    return GpuMinute(
        cluster=cluster,
        node=node,
        gpu_uuid=gpu,
        minute=T0 + timedelta(minutes=m),
        allocated_s=60.0 if alloc else 0.0,
        unallocated_s=0.0 if alloc else 60.0,
        consumed_gpu_s=consumed if measured else 0.0,
        activity_avg=consumed / 60 if measured else None,
        activity_max=consumed / 60 if measured else None,
        activity_metric="sm_active" if measured else None,
        power_w_avg=watts if measured else None,
        sample_count=6 if measured else 0,
        no_samples=not measured,
        allocation_id=alloc,
        scheduler=("kubernetes" if k8s else "slurm") if alloc else None,
        workload_class=cls if alloc else None,
        owner="alice" if alloc else None,
        team=team if alloc else None,
    )


def minutes() -> list[Record]:
    out: list[Record] = []
    h100, a100 = gpu_uuid("hpc-h100-001", 0), gpu_uuid("hpc-a100-001", 0)
    for m in range(60):
        out += [
            # hpc: a batch job at 50% and 400 W; a GPU nobody holds at 70 W
            minute("hpc", "hpc-h100-001", h100, m, "slurm/hpc/1", 30.0, 400.0),
            minute("hpc", "hpc-h100-001", gpu_uuid("hpc-h100-001", 1), m, None, 0.0, 70.0),
            # an interactive session at 10% and 100 W, its last 10 minutes without telemetry
            minute(
                "hpc", "hpc-a100-001", a100, m, "slurm/hpc/2", 6.0, 100.0,
                cls="interactive", team="nlp", measured=m < 50,
            ),
            # cloud: a service on an L40S at 75% and 300 W; a notebook on a 3g MIG slice
            # (no power per slice); a batch pod on an H100 for half an hour, busy, 700 W
            minute(
                "cloud", "cloud-l40s-01", gpu_uuid("cloud-l40s-01", 0), m, "k8s/cloud/a",
                45.0, 300.0, cls="service", team="search",
            ),
            minute(
                "cloud", "cloud-mig-01", MIG, m, "k8s/cloud/b", 12.0, None,
                cls="interactive", team="nlp",
            ),
            # lab: no rate card at all; edge: a MIG slice the card gives no share
            minute("lab", "lab-01", gpu_uuid("lab-01", 0), m, "slurm/lab/1", 30.0, 250.0),
            minute("edge", "edge-01", MIG_NO_SHARE, m, "k8s/edge/x", 30.0, None, cls="service"),
        ]  # fmt: skip
        if m < 30:
            out.append(
                minute(
                    "cloud", "cloud-h100-01", gpu_uuid("cloud-h100-01", 0), m, "k8s/cloud/c",
                    60.0, 700.0,
                )
            )  # fmt: skip
    return out


def transfer(  # noqa: PLR0917
    event_id: str, cluster: str, src: str, dst: str, gib: float, team: str
) -> Transfer:
    return Transfer(
        event_id=event_id,
        time=T0 + timedelta(minutes=5),
        interval_s=3600.0,
        cluster=cluster,
        from_env=src,
        to_env=dst,
        bytes=int(gib * (1 << 30)),
        source="billing_csv",
        team=team,
    )


def transfers() -> list[Record]:
    return [
        transfer("t1", "cloud", "cloud", "onprem", 10, "vision"),
        transfer("t2", "cloud", "cloud", "internet", 2, "search"),
        transfer("t3", "lab", "onprem", "cloud", 1, "vision"),  # no rate for lab
    ]
