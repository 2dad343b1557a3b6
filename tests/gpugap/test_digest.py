"""``gpugap digest``: the day's top idle allocations per owner, from the warehouse, mailed
through a real SMTP server (aiosmtpd, STARTTLS and AUTH) to <owner>@<domain>."""

from __future__ import annotations

import asyncio
from datetime import date
from pathlib import Path

import pytest

from gpugap.cli import main
from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas import Record
from gpugap.sinks.clickhouse.sink import ClickHouseSink
from tests.gpugap.monthly_mail import environment
from tests.sinks.receivers import smtp_capture
from tests.warehouse.test_views import T0, job, minute


def store(clickhouse: ClickHouseSettings, records: list[Record]) -> None:
    async def go() -> None:
        sink = ClickHouseSink(clickhouse)
        await sink.start()
        await sink.write(records)
        await sink.close()

    asyncio.run(go())


def test_each_owner_gets_their_top_allocations_by_absolute_waste(
    clickhouse: ClickHouseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # alice's job 2 holds GPU 3 for an hour at 10 % (54 min of gap), GPUs 0-1 for job 1 at
    # 50 % (2 x 30 min); "<bad owner>" is never mailed
    records: list[Record] = [job("1", "start", 2, None, 7200), job("2", "start", 1, None, 7200)]
    for m in range(60):
        records += [minute(0, m, "slurm/c/1", 30.0), minute(1, m, "slurm/c/1", 30.0)]
        records.append(minute(3, m, "slurm/c/2", 6.0))
    odd = minute(2, 0, "slurm/c/9", 0.0).model_copy(update={"owner": "<bad owner>"})
    store(clickhouse, [*records, odd])
    with smtp_capture(tmp_path) as (port, ca, mails):
        environment(monkeypatch, clickhouse, port, ca)
        day = T0.date().isoformat()
        assert main(["digest", "--day", day, "--top", "1", "--dry-run"]) == 0
        dry = capsys.readouterr()
        assert "1 mail(s) composed" in dry.err and "slurm/c/1" in dry.out
        assert main(["digest", "--day", day]) == 0
        assert "1 mail(s) sent" in capsys.readouterr().err
    (mail,) = mails
    assert mail.recipients == ["alice@example.org"]
    msg = mail.message
    assert msg["Subject"] == f"GPU-hours idle on {day}: 1.9 in your top allocations"
    body = msg.get_content()
    lines = [x for x in body.splitlines() if "slurm/c/" in x]
    # job 1: 2 GPU-h allocated, 1 used -> 1.00 idle; job 2: 1 allocated, 0.10 used -> 0.90
    assert [x.split()[0] for x in lines] == ["1.00", "0.90"]
    assert "slurm/c/1" in lines[0] and "slurm/c/9" not in body
    assert msg["Message-ID"].startswith("<gpugap.digest.")
    assert main(["digest", "--day", "2026-13-01"]) == 2  # a bad day is one line
    assert "expected YYYY-MM-DD" in capsys.readouterr().err


def test_without_an_owner_domain_it_says_what_to_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUGAP_EMAIL_OWNER_DOMAIN", raising=False)
    assert main(["digest", "--day", date(2026, 11, 2).isoformat(), "--dry-run"]) == 2
    assert "GPUGAP_EMAIL_OWNER_DOMAIN" in capsys.readouterr().err
