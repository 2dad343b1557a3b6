"""An embedded endpoint of its own whose warehouse database carries the scopes' row policies
(warehouse/embedded/scopes.py), with BI users scoped to a team and to a person, loaded with a
small estate of three people in two teams whose figures a test can compute by hand.

Its own endpoint: the row policies are written, when the endpoint starts, for the one database
it is told is the warehouse (GPUGAP_CLICKHOUSE_DATABASE); the session's endpoint serves a
database per test."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import SecretStr

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas import GpuMinute, NodeGpus, Record, SlurmJobEvent
from gpugap.schemas.examples import example_recommendation, gpu_uuid
from tests.harness.warehouse import CLICKHOUSE_PASSWORD, READER_PASSWORD

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
MINUTES = 60


@dataclass(frozen=True)
class Job:
    job_id: str
    owner: str
    team: str
    gpus: int
    busy: float  # each GPU's consumed seconds per minute


#: alice and bob in vision, carol in nlp: each job's GPUs on a node of its own
JOBS = (
    Job("101", "alice", "vision", 2, 30.0),
    Job("102", "bob", "vision", 1, 6.0),
    Job("201", "carol", "nlp", 4, 54.0),
)
#: the BI users: (name, team, person or '' for the whole team)
SCOPED = (("vision-bi", "vision", ""), ("alice-bi", "vision", "alice"), ("nlp-bi", "nlp", ""))
SCOPED_PASSWORD = "scoped-reader-password"


def allocated_h(job: Job) -> float:
    return job.gpus * MINUTES / 60


def consumed_h(job: Job) -> float:
    return job.gpus * job.busy * MINUTES / 3600


def records() -> list[Record]:
    out: list[Record] = []
    for n, job in enumerate(JOBS):
        node = f"n{n + 1}"
        for kind in ("start", "end"):
            out.append(
                SlurmJobEvent(
                    event_id=f"slurm/c/{job.job_id}/{kind}",
                    kind=kind,
                    time=T0 if kind == "start" else T0 + timedelta(minutes=MINUTES),
                    source="hook",
                    cluster="c",
                    job_id=job.job_id,
                    user=job.owner,
                    account=job.team,
                    partition="gpu",
                    nodes=(NodeGpus(node=node, gpu_indices=tuple(range(job.gpus))),),
                    gpus_total=job.gpus,
                    time_limit_s=4 * 3600,
                    start_time=T0,
                    end_time=T0 + timedelta(minutes=MINUTES) if kind == "end" else None,
                    state="COMPLETED" if kind == "end" else "RUNNING",
                    exit_code=0 if kind == "end" else None,
                )
            )
        for gpu in range(job.gpus):
            for m in range(MINUTES):
                out.append(
                    GpuMinute(
                        cluster="c",
                        node=node,
                        gpu_uuid=gpu_uuid(node, gpu),
                        minute=T0 + timedelta(minutes=m),
                        allocated_s=60.0,
                        unallocated_s=0.0,
                        consumed_gpu_s=job.busy,
                        activity_avg=job.busy / 60,
                        activity_max=job.busy / 60,
                        activity_metric="sm_active",
                        sample_count=6,
                        no_samples=False,
                        allocation_id=f"slurm/c/{job.job_id}",
                        scheduler="slurm",
                        workload_class="batch",
                        owner=job.owner,
                        team=job.team,
                    )
                )
    out += recommendations()
    return out


def recommendations() -> list[Record]:
    """A --time recommendation for each job's person (ids ``time-<owner>``)."""
    base = example_recommendation(T0)
    return [
        base.model_copy(
            update={
                "id": f"time-{job.owner}",
                "target": base.target.model_copy(
                    update={"cluster": "c", "user": job.owner, "account": job.team}
                ),
            }
        )
        for job in JOBS
    ]


@dataclass
class ScopedWarehouse:
    admin: ClickHouseSettings  # the admin, on the warehouse database
    url: str
    pid: int  # the endpoint's (tests keep it across a module: conftest.no_leaks)

    def as_user(self, name: str, password: str = SCOPED_PASSWORD) -> ClickHouseSettings:
        return self.admin.model_copy(
            update={"user": name, "password": SecretStr(password), "readonly_password": None}
        )

    @property
    def reader(self) -> ClickHouseSettings:
        return self.as_user("reader", READER_PASSWORD)


@contextmanager
def scoped_warehouse(root: Path) -> Iterator[ScopedWarehouse]:
    """The endpoint, migrated and loaded; stopped afterwards."""
    from gpugap.services.kafka import free_port
    from gpugap.sinks.clickhouse.sink import ClickHouseSink
    from gpugap.warehouse.migrate import migrate
    from tests.harness.embedded_clickhouse import EmbeddedClickHouse

    database = f"scoped{uuid.uuid4().hex[:8]}"
    users = root / "scoped-users.json"
    users.write_text(
        json.dumps(
            {
                "users": [
                    {"name": n, "password": SCOPED_PASSWORD, "team": t, "user": u}
                    for n, t, u in SCOPED
                ]
            }
        )
    )
    users.chmod(0o600)
    server = EmbeddedClickHouse(
        root / "data",
        free_port(),
        env={
            "GPUGAP_CLICKHOUSE_PASSWORD": CLICKHOUSE_PASSWORD,
            "GPUGAP_CLICKHOUSE_READONLY_PASSWORD": READER_PASSWORD,
            "GPUGAP_CLICKHOUSE_DATABASE": database,
            "GPUGAP_CLICKHOUSE_SCOPED_USERS_FILE": str(users),
        },
    )
    server.start()
    try:
        admin = ClickHouseSettings(
            url=server.url,
            database=database,
            password=CLICKHOUSE_PASSWORD,
            readonly_password=READER_PASSWORD,
        )
        migrate(admin)

        async def write() -> None:
            sink = ClickHouseSink(admin)
            await sink.start()
            await sink.write(records())
            await sink.close()

        asyncio.run(write())
        assert server.proc is not None
        yield ScopedWarehouse(admin, server.url, server.proc.pid)
    finally:
        server.stop()
