"""``gpugap backfill slurm`` on the sacct output sites have (known answers, no services):
``sacct -D`` dumps where a requeued job has a record per run, array tasks and heterogeneous
components, several clusters in one dump, ISO times, ``-X`` dumps without steps, a dump of
which nothing can be read; the live mode numbering a run after a requeue that happened
before its chunk (docs/architecture.md#slurm-job-runs, docs/backfill.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpugap.cli import main
from gpugap.groundfloor.settings import Settings
from gpugap.producers import run_producer
from gpugap.producers.backfill.plugin import SOURCES
from gpugap.producers.backfill.settings import SlurmBackfillSettings
from gpugap.producers.backfill.slurm import SlurmHistory
from gpugap.producers.slurm.fields import SACCT_FIELDS
from gpugap.schemas import DeadLetter, SlurmJobEvent
from gpugap.schemas.errors import ConfigError
from tests.streams.helpers import Recording

SLURM = "slurm.jobs.v1"
DAY = datetime(2026, 5, 1, tzinfo=UTC)
SINCE, UNTIL = "2026-05-01T00:00:00Z", "2026-05-02T00:00:00Z"


def at(hms: str) -> int:
    """Epoch seconds of 'HH:MM' on DAY ('-HH:MM': the day before)."""
    before = hms.startswith("-")
    h, m = (int(x) for x in hms.lstrip("-").split(":"))
    return int(DAY.timestamp()) + h * 3600 + m * 60 - 86_400 * before


def line(  # noqa: PLR0917
    job: str,
    raw: str,
    state: str,
    submit: str,
    start: str,
    end: str | None,
    nodes: str = "gpu01",
    gpus: int = 2,
    cluster: str = "hpc",
    name: str = "train.sh",
    user: str = "alice",
) -> str:
    """One job record of ``sacct -P -n -o SACCT_FIELDS`` (epoch times, as SLURM_TIME_FORMAT=%s)."""
    tres = f"billing=8,cpu=8,gres/gpu={gpus},node=1"
    stop = str(at(end)) if end else "Unknown"
    return "|".join([
        job, raw, user, "vision", "gpu", "normal", state, "0:0", "1-00:00:00",
        str(at(submit)), str(at(start)), stop, nodes, tres, cluster, name,
    ])  # fmt: skip


def step(job: str, raw: str, what: str, state: str, start: str, end: str | None) -> str:  # noqa: PLR0917
    stop = str(at(end)) if end else "Unknown"
    return "|".join([
        f"{job}.{what}", f"{raw}.{what}", "", "vision", "", "", state, "0:0", "",
        str(at(start)), str(at(start)), stop, "gpu01", "cpu=8,gres/gpu=2,node=1", "hpc", what,
    ])  # fmt: skip


def requeued(job: str, raw: str, **kw: Any) -> list[str]:
    """What ``sacct -D`` prints for a job whose first run ended with its node (NODE_FAIL),
    requeued by Slurm (a new record, its submit time reset) and completed on its second run."""
    return [
        line(job, raw, "NODE_FAIL", "09:58", "10:00", "11:00", **kw),
        step(job, raw, "batch", "CANCELLED", "10:00", "11:00"),
        line(job, raw, "COMPLETED", "11:00", "11:30", "13:30", **kw),
        step(job, raw, "batch", "COMPLETED", "11:30", "13:30"),
    ]


def backfill(
    tmp_path: Path, text: str, **cfg: Any
) -> tuple[list[SlurmJobEvent], list[DeadLetter], SlurmHistory]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    dump = tmp_path / "sacct.txt"
    dump.write_text(text)
    config = SlurmBackfillSettings(checkpoint_dir=tmp_path / "cp", chunk_s=86_400, **cfg)
    since, until = DAY, datetime(2026, 5, 2, tzinfo=UTC)
    source = SlurmHistory(Settings(), config, since=since, until=until, sacct_file=dump)
    pub = Recording()
    asyncio.run(run_producer(source, pub))
    return pub.of(SlurmJobEvent), pub.of(DeadLetter), source


def by_allocation(events: list[SlurmJobEvent]) -> dict[str, list[tuple[str, str, str]]]:
    out: dict[str, list[tuple[str, str, str]]] = {}
    for e in events:
        out.setdefault(e.allocation_id, []).append(
            (e.kind.value, e.time.strftime("%H:%M"), e.state)
        )
    return out


def test_a_requeued_job_in_a_sacct_D_dump_is_one_allocation_per_run(tmp_path: Path) -> None:
    # job 13: `scontrol requeue` while running (REQUEUED), its second run still running
    text = "\n".join([
        *requeued("12", "12"),
        line("13", "13", "REQUEUED", "08:00", "08:05", "09:00"),
        step("13", "13", "batch", "CANCELLED", "08:05", "09:00"),
        line("13", "13", "RUNNING", "09:00", "09:30", None),
        step("13", "13", "batch", "RUNNING", "09:30", None),
    ]) + "\n"  # fmt: skip
    events, letters, _ = backfill(tmp_path, text)
    assert not letters
    assert by_allocation(events) == {
        "slurm/hpc/12": [("start", "10:00", "RUNNING"), ("end", "11:00", "NODE_FAIL")],
        "slurm/hpc/12#1": [("start", "11:30", "RUNNING"), ("end", "13:30", "COMPLETED")],
        # a REQUEUED run ends (its GPUs are not held for ever)
        "slurm/hpc/13": [("start", "08:05", "RUNNING"), ("end", "09:00", "REQUEUED")],
        "slurm/hpc/13#1": [("start", "09:30", "RUNNING")],
    }
    first = [e for e in events if e.allocation_id == "slurm/hpc/12"]
    assert [e.event_id for e in first] == ["slurm/hpc/12/start", "slurm/hpc/12/end"]  # as before
    assert {e.run for e in first} == {None} and {e.run for e in events} == {None, 1}
    assert all(not e.interactive for e in events)  # each run's own .batch step


def test_array_tasks_and_het_components_are_allocations_of_their_own(tmp_path: Path) -> None:
    """10 tasks of array 20 (task 7 requeued after a node failure): 11 allocations; het job
    30's two components (requeued as a whole): 4."""
    lines: list[str] = []
    for task in range(10):
        raw = "20" if task == 9 else str(21 + task)  # the last task keeps the array's id
        if task == 7:
            lines += requeued(f"20_{task}", raw, gpus=1)
        else:
            lines.append(line(f"20_{task}", raw, "COMPLETED", "09:00", "10:00", "10:30", gpus=1))
    for offset, raw in ((0, "30"), (1, "31")):
        lines += requeued(f"30+{offset}", raw, nodes=f"gpu0{offset + 2}", gpus=4)
    events, letters, _ = backfill(tmp_path, "\n".join(lines) + "\n")
    assert not letters
    got = by_allocation(events)
    array = sorted(a for a in got if a.startswith("slurm/hpc/20_"))
    assert array == sorted([*(f"slurm/hpc/20_{t}" for t in range(10)), "slurm/hpc/20_7#1"])
    assert got["slurm/hpc/20_7"] == [("start", "10:00", "RUNNING"), ("end", "11:00", "NODE_FAIL")]
    assert got["slurm/hpc/20_7#1"][0] == ("start", "11:30", "RUNNING")
    het = sorted(a for a in got if a.startswith("slurm/hpc/30+"))
    assert het == ["slurm/hpc/30+0", "slurm/hpc/30+0#1", "slurm/hpc/30+1", "slurm/hpc/30+1#1"]
    assert all(len(v) == 2 for v in got.values())  # each with its own start and end
    comps = {e.allocation_id: e for e in events if e.kind.value == "start"}
    assert (comps["slurm/hpc/30+1#1"].het_job_id, comps["slurm/hpc/30+1#1"].het_job_offset) == (
        30,
        1,
    )
    assert comps["slurm/hpc/20_7#1"].array_task_id == 7


def test_two_clusters_sharing_a_job_id_in_one_dump_are_both_kept(tmp_path: Path) -> None:
    text = "\n".join([
        line("12", "12", "COMPLETED", "09:00", "10:00", "11:00", cluster="a"),
        line("12", "12", "COMPLETED", "09:00", "12:00", "13:00", cluster="b", gpus=4),
    ]) + "\n"  # fmt: skip
    events, _, _ = backfill(tmp_path, text)
    got = by_allocation(events)
    assert got == {
        "slurm/a/12": [("start", "10:00", "RUNNING"), ("end", "11:00", "COMPLETED")],
        "slurm/b/12": [("start", "12:00", "RUNNING"), ("end", "13:00", "COMPLETED")],
    }
    # a cluster name given for a dump of several: which is which cannot be said
    with pytest.raises(ConfigError, match="holds the jobs of 2 clusters"):
        backfill(tmp_path / "named", text, cluster="prod")


HEADER = SACCT_FIELDS.replace(",", "|")


def iso(text: str, fmt: str) -> str:
    """The dump with its epoch times printed as ISO text ('%Y-%m-%dT%H:%M:%S' + suffix)."""
    out = []
    for row in text.splitlines():
        f = row.split("|")
        for i in (9, 10, 11):
            if f[i].isdigit():
                f[i] = datetime.fromtimestamp(int(f[i]), UTC).strftime(fmt)
        out.append("|".join(f))
    return "\n".join(out) + "\n"


def test_iso_times_with_an_offset_are_read(tmp_path: Path) -> None:
    text = HEADER + "\n" + "\n".join(requeued("12", "12")) + "\n"
    want = by_allocation(backfill(tmp_path / "epoch", text)[0])
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S+00:00"):
        events, letters, _ = backfill(tmp_path / fmt[-3:].strip("%:+"), iso(text, fmt))
        assert not letters and by_allocation(events) == want, fmt


def run_cli(tmp_path: Path, dump: str, *more: str) -> tuple[int, str]:
    import contextlib
    import io

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "dump.txt"
    path.write_text(dump)
    err = io.StringIO()
    argv = ["backfill", "slurm", "--since", SINCE, "--until", UNTIL, "--sacct-file", str(path)]
    argv += ["--out", str(tmp_path / "out.jsonl"), "--checkpoint-dir", str(tmp_path / "cp")]
    with contextlib.redirect_stderr(err):
        code = main([*argv, *more])
    return code, err.getvalue()


def test_naive_iso_times_need_the_zone_sacct_ran_in(tmp_path: Path) -> None:
    """sacct prints local time with no offset: refused (exit 2, the fix named) unless
    --timezone says which; then read in that zone (Berlin is UTC+2 in May)."""
    text = HEADER + "\n" + "\n".join(requeued("12", "12")) + "\n"
    naive = iso(text, "%Y-%m-%dT%H:%M:%S")
    code, err = run_cli(tmp_path / "refused", naive)
    assert code == 2 and "no UTC offset" in err and "--timezone" in err, err
    assert "SLURM_TIME_FORMAT=%s" in err and "records published" not in err
    code, err = run_cli(tmp_path / "berlin", naive, "--timezone", "Europe/Berlin")
    assert code == 0, err
    rows = [json.loads(r) for r in (tmp_path / "berlin" / "out.jsonl").read_text().splitlines()]
    events = [SlurmJobEvent.model_validate(r["value"]) for r in rows if r["topic"] == SLURM]
    times = {(e.allocation_id, e.kind.value): e.time.strftime("%H:%M") for e in events}
    assert times[("slurm/hpc/12", "start")] == "08:00"  # 10:00 in Berlin
    assert times[("slurm/hpc/12#1", "end")] == "11:30"
    code, err = run_cli(tmp_path / "bad", naive, "--timezone", "Mars/Olympus")
    assert code == 2 and "not a zone name" in err, err


def test_a_dump_of_which_nothing_can_be_read_exits_non_zero_with_the_fix(tmp_path: Path) -> None:
    text = "\n".join(requeued("12", "12")).replace("|", ";") + "\n"  # another delimiter
    code, err = run_cli(tmp_path, text)
    assert code == 2, err
    assert "none of its 4 lines can be read" in err and f"-o {SACCT_FIELDS}" in err, err
    assert "records published" not in err


def test_a_job_without_steps_in_the_dump_keeps_its_own_evidence(tmp_path: Path) -> None:
    """``sacct -X`` prints no steps: no .batch step says nothing. The job's name, or its
    submit line where the dump has it, decides; nothing known: the default class (batch)."""
    text = "\n".join([
        line("12", "12", "COMPLETED", "09:00", "10:00", "11:00", name="train.sh"),
        line("13", "13", "COMPLETED", "09:00", "10:00", "11:00", name="bash"),
    ]) + "\n"  # fmt: skip
    events, _, _ = backfill(tmp_path / "x", text)
    assert {e.job_id: e.interactive for e in events} == {"12": False, "13": True}
    # a site's dump with SubmitLine: sbatch / salloc say it, whatever the name
    header = HEADER.replace("|JobName", "|SubmitLine|JobName")
    rows = [
        line("14", "14", "COMPLETED", "09:00", "10:00", "11:00", name="bash")
        .replace("|hpc|", "|hpc|sbatch --gres=gpu:2 run.sh|"),
        line("15", "15", "COMPLETED", "09:00", "10:00", "11:00", name="notebook")
        .replace("|hpc|", "|hpc|salloc -G 2|"),
    ]  # fmt: skip
    events, letters, _ = backfill(tmp_path / "sl", header + "\n" + "\n".join(rows) + "\n")
    assert not letters and {e.job_id: e.interactive for e in events} == {"14": False, "15": True}


def test_a_long_chunk_is_accepted_for_sacct_not_for_prometheus_range_queries() -> None:
    """The points-per-series limit is Prometheus's (query_range), not sacct's."""
    ns = argparse.Namespace(opt_chunk_s=400_000)
    cfg = SOURCES["slurm"].config(ns)
    assert isinstance(cfg, SlurmBackfillSettings) and cfg.chunk_s == 400_000
    with pytest.raises(ConfigError, match="points_per_series"):
        SOURCES["prometheus"].config(ns)


# --- the live mode: sacct itself, runs numbered across chunks ---------------------------------


def fake_sacct(tmp_path: Path, *, restarts: bool) -> str:
    """A stand-in for sacct 22.05 (or 24.11 with ``restarts``): the requeued records query
    (``-X --state RQ,NF,PR,BF``) answers job 12's first run, which ended before --since;
    the chunk's query its second run, with its header line."""
    header = HEADER.replace("|JobName", "|Restarts|JobName") if restarts else HEADER

    def rows(*lines: str) -> str:
        out = [header]
        for ln in lines:
            out.append(ln.replace("|hpc|", "|hpc|1|") if restarts else ln)
        return "\n".join(out) + "\n"

    first = line("12", "12", "NODE_FAIL", "-09:00", "-09:05", "-09:40")  # before --since
    (tmp_path / "requeued.txt").write_text(rows() if restarts else rows(first))
    second = [
        line("12", "12", "COMPLETED", "10:00", "10:30", "12:30"),
        step("12", "12", "batch", "COMPLETED", "10:30", "12:30"),
    ]
    (tmp_path / "chunk.txt").write_text(rows(*second))
    fields = "JobID JobIDRaw State Start End" + (" Restarts" if restarts else "")
    script = tmp_path / "sacct"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *--helpformat*) echo "{fields}";;\n'
        f"  *RQ,NF,PR,BF*) cat {tmp_path / 'requeued.txt'};;\n"
        f"  *) cat {tmp_path / 'chunk.txt'};; esac\n"
    )
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("restarts", [False, True], ids=["22.05", "24.11-restarts"])
def test_live_sacct_numbers_a_run_whose_requeue_was_before_the_chunk(
    tmp_path: Path, restarts: bool
) -> None:
    sacct = fake_sacct(tmp_path, restarts=restarts)
    config = SlurmBackfillSettings(checkpoint_dir=tmp_path / "cp", chunk_s=86_400, sacct=sacct)
    source = SlurmHistory(Settings(), config, since=DAY, until=datetime(2026, 5, 2, tzinfo=UTC))
    pub = Recording()
    asyncio.run(run_producer(source, pub))
    assert not pub.of(DeadLetter)
    assert by_allocation(pub.of(SlurmJobEvent)) == {
        "slurm/hpc/12#1": [("start", "10:30", "RUNNING"), ("end", "12:30", "COMPLETED")],
    }
