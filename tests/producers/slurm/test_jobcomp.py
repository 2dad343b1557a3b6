"""jobcomp/kafka records -> JobInfo -> events, on records recorded from a real Slurm 26.05.3
(tests/fixtures/slurm/jobcomp/README.md), and the run ledger's numbering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpugap.producers.slurm import jobcomp
from gpugap.producers.slurm.event import events_for
from gpugap.producers.slurm.jobcomp_runs import RunLedger
from gpugap.producers.slurm.parse import ParseError
from gpugap.schemas import decode
from gpugap.schemas.topics import SLURM_JOBS

FIXTURES = Path(__file__).parents[2] / "fixtures" / "slurm" / "jobcomp"


def recorded(name: str) -> dict[str, object]:
    return dict(json.loads((FIXTURES / name).read_text()))


def raw(obj: dict[str, object]) -> bytes:
    return json.dumps(obj).encode()


def test_a_recorded_start_record_is_a_start_with_a_count_and_no_indices() -> None:
    record = jobcomp.parse((FIXTURES / "start-gres2-n2.json").read_bytes())
    info = record.info
    assert (record.kind, record.sluid, info.raw_id, info.job_id) == (
        "start",
        "S48DM961ZBNA00",
        "1",
        "1",
    )
    assert info.nodes == ["n2"] and info.gpus == 2 and info.gpu_indices is None
    assert info.time_limit_s == 120  # seconds, not minutes
    # UTC without an offset: 2026-12-06T16:11:15 is 1796573475 whatever the zone
    assert (info.submit, info.eligible, info.start) == (1796573474, 1796573474, 1796573475)
    assert (info.user, info.account, info.partition, info.qos) == (
        "cloudsdk",
        "ml-team",
        "gpu",
        "normal",
    )
    (start,) = events_for(info, "gapprobe", "jobcomp")
    event = decode(SLURM_JOBS, json.dumps(start).encode())
    assert event.event_id == "slurm/gapprobe/1/start"
    assert event.gpus_total == 2 and [n.gpu_indices for n in event.nodes] == [()]


def test_a_recorded_het_component_end_is_its_own_allocation() -> None:
    record = jobcomp.parse((FIXTURES / "end-het-component1.json").read_bytes())
    info = record.info
    assert record.kind == "end" and info.state == "COMPLETED"
    assert info.job_id == "2+1" and info.raw_id == "3"
    assert info.end is not None and info.start is not None and info.end - info.start == 8
    assert info.exit_code == 0
    kinds = [e["kind"] for e in events_for(info, "gapprobe", "jobcomp")]
    assert kinds == ["start", "end"]  # an end without its start still says when it started


def test_the_run_a_requeue_ended_says_pending_and_becomes_requeued() -> None:
    obj = recorded("end-het-component1.json")
    obj.update(state="PENDING", het_job_id=0, het_job_offset=0, pack_job_id=0)
    info = jobcomp.parse(raw(obj)).info
    assert info.state == "REQUEUED" and info.job_id == "3"
    assert info.exit_code is None  # Slurm ended it: no exit code of its own


def test_a_job_cancelled_while_pending_has_only_an_end() -> None:
    obj = recorded("end-het-component1.json")
    obj.update(state="CANCELLED", nodes=None, total_nodes=0, het_job_id=0, het_job_offset=0)
    obj.pop("tres_alloc")
    info = jobcomp.parse(raw(obj)).info
    assert not info.started
    (end,) = events_for(info, "gapprobe", "jobcomp")
    assert end["kind"] == "end" and end["gpus_total"] == 0 and end["nodes"] == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (None, "not JSON"),
        ({"jobid": True}, "jobid must be a non-negative integer"),
        ({"jobid": None}, "no jobid"),
        ({"@end": "2026-12-06 16:11:23"}, "is not YYYY-MM-DDTHH:MM:SS"),
        ({"state": "RUNNING"}, "is not a final state"),
        ({"state": None}, "needs both state and @end"),
        ({"nodes": "gpu[3-1]"}, "bad range"),
        ({"exit_code": "zero"}, "is not X:Y"),
        ({"sluid": "s/../../etc"}, "is not a SLUID"),
        ({"tres_alloc": "gres/gpu=lots"}, "gres/gpu"),
    ],
)
def test_a_record_that_cannot_be_read_says_why(
    change: dict[str, object] | None, reason: str
) -> None:
    body = (
        b"{not json" if change is None else raw({**recorded("end-het-component1.json"), **change})
    )
    with pytest.raises(ParseError, match=reason):
        jobcomp.parse(body)


def test_records_are_bounded() -> None:
    with pytest.raises(ParseError, match="at most"):
        jobcomp.parse(b" " * (jobcomp.MAX_RECORD_BYTES + 1))
    with pytest.raises(ParseError, match="not a JSON object"):
        jobcomp.parse(b"[1, 2]")
    with pytest.raises(ParseError, match="empty message"):
        jobcomp.parse(None)


def test_runs_are_numbered_by_slurmctld_then_by_sluid_order(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path / "runs.json")
    # slurmctld knows the job's current run: exact
    assert ledger.run_of("7", "S48DM961ZBNA00", ("S48DM961ZBNA00", 0)) == 0
    assert ledger.run_of("7", "S48DM961ZBNZ00", ("S48DM961ZBNZ00", 1)) == 1
    # seen before: the same run, whatever slurmctld says now
    assert ledger.run_of("7", "S48DM961ZBNA00", ("S48DM961ZC0000", 2)) == 0
    # a job slurmctld forgot: its runs in SLUID (time) order
    assert ledger.run_of("8", "S48DM961ZBNA00", None) == 0
    assert ledger.run_of("8", "S48DM961ZBPA00", None) == 1
    # an earlier run's record after slurmctld moved on (a broker outage): one before it
    assert ledger.run_of("9", "S48DM961ZBNA00", ("S48DM961ZBPA00", 1)) == 0
    ledger.save()
    again = RunLedger(tmp_path / "runs.json")
    assert again.known("7", "S48DM961ZBNZ00") == 1 and again.known("7", "S0") is None
