"""``gpugap produce slurm-quotas``: what a real slurmdbd (Slurm 22.05.8, MariaDB) printed
(recorded under tests/fixtures/slurm/quotas/, see its README) -> the exact QueueQuota records;
then the producer against the test harness's real slurmdbd, and with slurmdbd unreachable."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugap.groundfloor.kafka.publish import JsonlPublisher
from gpugap.groundfloor.settings import Settings
from gpugap.producers.base import run_producer
from gpugap.producers.slurm import quotas
from gpugap.producers.slurm.poll_settings import SlurmQuotaSettings
from gpugap.producers.slurm.quotas_producer import SlurmQuotaProducer
from gpugap.schemas.models import DeadLetter, QueueQuota
from gpugap.schemas.topics import DEAD_LETTER, QUEUE_QUOTAS
from gpugap.schemas.types import QueueKind
from tests.harness.slurm_cluster import SlurmCluster

RECORDED = Path(__file__).parents[2] / "fixtures" / "slurm" / "quotas"
T = datetime(2026, 12, 7, 6, 20, tzinfo=UTC)
QOS, ASSOC = QueueKind.SLURM_QOS, QueueKind.SLURM_ASSOCIATION


def quota(
    kind: QueueKind,
    queue: str,
    resource: str,
    gpus: float,
    *,
    cluster: str = "c1",
    flavor: str | None = None,
    time: datetime = T,
    interval_s: float = 300.0,
) -> QueueQuota:
    return QueueQuota(
        cluster=cluster,
        time=time,
        interval_s=interval_s,
        kind=kind,
        queue=queue,
        flavor=flavor,
        resource=resource,
        entitled_gpus=gpus,
        limit_gpus=gpus,
        held_gpus=None,
    )


def recorded() -> list[quotas.Limit]:
    qos, bad = quotas.parse_qos((RECORDED / "qos.txt").read_text())
    assoc, bad_assoc = quotas.parse_associations((RECORDED / "assoc.txt").read_text(), "gga57211")
    assert bad == bad_assoc == []
    return qos + assoc


def test_recorded_qos_and_associations() -> None:
    """QOS gpu4 (gres/gpu=4) and a100x2 (typed, beside a CPU limit; its MaxTRESPerUser is not
    an entitlement) are published, cpuonly and normal are not; the physics account (8 GPUs)
    and nobody's physics association on partition long (2 a100) are, root's and bio's (no
    limits) are not."""
    assert [(q.kind, q.queue, q.partition, q.resource, q.gpus) for q in recorded()] == [
        (QOS, "gpu4", None, "gres/gpu", 4),
        (QOS, "a100x2", None, "gres/gpu:a100", 2),
        (ASSOC, "physics", None, "gres/gpu", 8),
        (ASSOC, "physics/nobody", "long", "gres/gpu:a100", 2),
    ]
    got = [quotas.queue_quota(q, cluster="c1", time=T, interval_s=300.0) for q in recorded()[:3]]
    assert got == [
        quota(QOS, "gpu4", "gres/gpu", 4),
        quota(QOS, "a100x2", "gres/gpu:a100", 2),
        quota(ASSOC, "physics", "gres/gpu", 8),
    ]


def test_recorded_user_association_record() -> None:
    user_assoc = recorded()[3]
    got = quotas.queue_quota(user_assoc, cluster="c1", time=T, interval_s=300.0)
    assert got == quota(ASSOC, "physics/nobody", "gres/gpu:a100", 2, flavor="long")


def test_other_clusters_associations_are_left_out() -> None:
    assoc, _ = quotas.parse_associations((RECORDED / "assoc.txt").read_text(), "another")
    assert assoc == []


def test_limits_read() -> None:
    # a typed limit is a part of the untyped one: with both, the untyped alone (the warehouse
    # sums an entity's records)
    assert quotas.gpu_limits("cpu=64,gres/gpu=8,gres/gpu:a100=2,mem=10G") == [("gres/gpu", 8)]
    assert quotas.gpu_limits("gres/gpu:a100=2,gres/gpu:h100=1") == [
        ("gres/gpu:a100", 2),
        ("gres/gpu:h100", 1),
    ]
    assert quotas.gpu_limits("") == quotas.gpu_limits("cpu=10,gres/gpumem=4") == []
    qos, bad = quotas.parse_qos("ok|gres/gpu=2\nbroken|gres/gpu=lots\n")
    assert [q.queue for q in qos] == ["ok"] and len(bad) == 1


# --- against the harness's real slurmdbd --------------------------------------------------


async def _publish_once(
    settings: SlurmQuotaSettings, out: Path
) -> tuple[SlurmQuotaProducer, list[QueueQuota], list[DeadLetter]]:
    producer = SlurmQuotaProducer(Settings(), settings)
    await run_producer(producer, JsonlPublisher(out), once=True, stop=asyncio.Event())
    lines = [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []
    assert {ln["topic"] for ln in lines} <= {QUEUE_QUOTAS.name, DEAD_LETTER.name}
    return (
        producer,
        [QueueQuota.model_validate(ln["value"]) for ln in lines if ln["topic"] != DEAD_LETTER.name],
        [DeadLetter.model_validate(ln["value"]) for ln in lines if ln["topic"] == DEAD_LETTER.name],
    )


@pytest.mark.slurm
def test_real_slurmdbd_qos_and_associations(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QOS and associations created with sacctmgr on the real slurmdbd come out as exactly
    the records they define; those without a GPU limit do not."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))  # for the sacctmgr and scontrol it runs
    tag = "gg" + uuid.uuid4().hex[:6]
    qos4, qos_cpu, acct, bare = f"{tag}q4", f"{tag}qcpu", f"{tag}acct", f"{tag}bare"
    created = [
        ("add", "qos", qos4, "GrpTRES=gres/gpu=4"),
        ("add", "qos", qos_cpu, "GrpTRES=cpu=10"),
        ("add", "account", acct, f"cluster={slurm.name}"),
        ("add", "account", bare, f"cluster={slurm.name}"),
        ("modify", "account", acct, "set", "GrpTRES=gres/gpu=8"),
        ("add", "user", "root", f"account={acct}", f"cluster={slurm.name}"),
        ("modify", "user", "root", "where", f"account={acct}", "set", "GrpTRES=gres/gpu=2"),
    ]
    try:
        for argv in created:
            slurm.cmd("sacctmgr", "-i", *argv)
        settings = SlurmQuotaSettings(cluster="real")
        producer, got, dead = asyncio.run(_publish_once(settings, tmp_path / "out.jsonl"))
        assert producer.skipped_polls == 0
        assert producer.slurm_cluster == slurm.name
        assert dead == []
        mine = [q for q in got if q.queue.startswith(tag)]
        time = got[0].time
        assert mine == [
            quota(QOS, qos4, "gres/gpu", 4, cluster="real", time=time),
            quota(ASSOC, acct, "gres/gpu", 8, cluster="real", time=time),
            # root's association in the account: account/user, the key a job's account and
            # user join on
            quota(ASSOC, f"{acct}/root", "gres/gpu", 2, cluster="real", time=time),
        ]
        assert all(q.time == time and q.cluster == "real" for q in got)
    finally:
        slurm.cmd("sacctmgr", "-i", "delete", "user", "root", f"account={acct}", check=False)
        slurm.cmd("sacctmgr", "-i", "delete", "account", acct, bare, check=False)
        slurm.cmd("sacctmgr", "-i", "delete", "qos", qos4, qos_cpu, check=False)


@pytest.mark.slurm
def test_unreachable_slurmdbd_skips_the_poll_with_a_clear_error(
    slurm: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """sacctmgr pointed at a port where no slurmdbd listens: the poll publishes nothing and
    logs why; the producer does not crash, and the next poll would try again."""
    from tests.harness.slurm_cluster import free_port

    conf = tmp_path / "slurm.conf"
    lines = slurm.conf.read_text().splitlines()
    conf.write_text(
        "\n".join(
            f"AccountingStoragePort={free_port()}"
            if ln.startswith("AccountingStoragePort=")
            else ln
            for ln in lines
        )
        + "\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    caplog.set_level(logging.ERROR, logger="gpugap.producers.slurm.quotas_producer")
    settings = SlurmQuotaSettings(cluster="real", command_timeout_s=60)
    producer, got, dead = asyncio.run(_publish_once(settings, tmp_path / "out.jsonl"))
    assert got == dead == [] and producer.skipped_polls == 1 and producer.ticks == 1
    assert "sacctmgr" in caplog.text and "slurmdbd" in caplog.text
