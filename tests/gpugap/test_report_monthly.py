"""``gpugap monthly-report`` on a hand-computed November 2026: three teams, five users, jobs in
October and December that must not count, queue waits, recommendations open, decided and
stale. Written through the sink (tests/warehouse/test_views.store), mailed through a real SMTP
server, every send in report_sends."""

from __future__ import annotations

import email
import email.policy
from datetime import timedelta
from pathlib import Path

import pytest

from gpugap.cli import main
from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.recommend.engine import decide
from gpugap.report.monthly import Month, Rank, build
from gpugap.schemas import K8sPodEvent, Record, SlurmJobEvent
from gpugap.schemas.examples import example_recommendation
from gpugap.schemas.models import RecommendationTarget
from gpugap.warehouse.client import connect
from tests.gpugap.monthly_mail import environment, parts
from tests.sinks.receivers import smtp_capture
from tests.warehouse.test_views import T0, job, minute, store

NOV = Month(2026, 11)
DAY = timedelta(days=1)


def held(
    gpu: int, start: timedelta, minutes: int, alloc: str, *, team: str, owner: str, busy_s: float
) -> list[Record]:
    """GPU ``gpu`` of n1 held by ``alloc`` for ``minutes`` from T0 + ``start``, ``busy_s`` of
    each minute consumed."""
    return [
        minute(gpu, m, alloc, busy_s).model_copy(
            update={"minute": T0 + start + timedelta(minutes=m), "team": team, "owner": owner}
        )
        for m in range(minutes)
    ]


def slurm(
    job_id: str, gpus: int, start: timedelta, *, waited_min: int, team: str, user: str
) -> SlurmJobEvent:
    began = T0 + start
    return job(job_id, "start", gpus, None, 7200).model_copy(
        update={
            "time": began, "start_time": began,
            "submit_time": began - timedelta(minutes=waited_min),
            "user": user, "account": team,
        }
    )  # fmt: skip


def estate() -> list[Record]:
    """Hand-computed (GPU-hours; gap = allocated - consumed, everything measured):

    vision   alice v1: 2 GPUs x 1 h at 50 %  -> 2.0 allocated, 1.0 consumed, 1.0 gap (Nov 2)
             bob   v2: 1 GPU x 2 h at 10 %   -> 2.0, 0.2, 1.8 (Nov 15)       team: 4.0, 1.2, 2.8
    nlp      carol n1: 1 GPU x 1 h idle      -> 1.0, 0.0, 1.0 (Nov 2)        team: 1.0, 0.0, 1.0
    robotics dave  r1: 1 GPU x 1 h busy      -> 1.0, 1.0, 0.0 (Nov 3)
             erin  r2: 1 GPU x 1 h at 90 %   -> 1.0, 0.9, 0.1 (Nov 3)        team: 2.0, 1.9, 0.1
    outside  vision o1 on Oct 31 and nlp d1 on Dec 1: 1 GPU-hour idle each, in no figure.
    Waits: v1 10 min (2 GPUs), v2 30 min (1 GPU); a robotics pod (namespace robo) 30 min."""
    out: list[Record] = [
        slurm("v1", 2, timedelta(0), waited_min=10, team="vision", user="alice"),
        slurm("v2", 1, 13 * DAY, waited_min=30, team="vision", user="bob"),
        slurm("n1", 1, timedelta(0), waited_min=0, team="nlp", user="carol"),
        slurm("r1", 1, DAY, waited_min=0, team="robotics", user="dave"),
        slurm("r2", 1, DAY, waited_min=0, team="robotics", user="erin"),
        slurm("o1", 1, -2 * DAY, waited_min=5, team="vision", user="alice"),
        slurm("d1", 1, 29 * DAY, waited_min=5, team="nlp", user="carol"),
    ]
    out += held(0, timedelta(0), 60, "slurm/c/v1", team="vision", owner="alice", busy_s=30.0)
    out += held(1, timedelta(0), 60, "slurm/c/v1", team="vision", owner="alice", busy_s=30.0)
    out += held(0, 13 * DAY, 120, "slurm/c/v2", team="vision", owner="bob", busy_s=6.0)
    out += held(2, timedelta(0), 60, "slurm/c/n1", team="nlp", owner="carol", busy_s=0.0)
    out += held(0, DAY, 60, "slurm/c/r1", team="robotics", owner="dave", busy_s=60.0)
    out += held(1, DAY, 60, "slurm/c/r2", team="robotics", owner="erin", busy_s=54.0)
    out += held(0, -2 * DAY, 60, "slurm/c/o1", team="vision", owner="alice", busy_s=0.0)
    out += held(0, 29 * DAY, 60, "slurm/c/d1", team="nlp", owner="carol", busy_s=0.0)
    pod = {
        "source": "watch", "cluster": "c", "uid": "uid-robo", "namespace": "robo", "name": "sim",
        "node": "k1", "gpus": 1, "gpu_resource": "nvidia.com/gpu", "owner": "dave",
        "team": "robotics", "created_time": T0 + DAY - timedelta(minutes=30),
        "workload_class": "batch",
    }  # fmt: skip
    out.append(K8sPodEvent(event_id="k8s/c/uid-robo/bound", kind="bound", time=T0 + DAY,
                           phase="Pending", **pod))  # fmt: skip
    return out


def recommendations() -> list[Record]:
    """Open: vision's (alice's job family), robotics' (a workload in namespace robo); nlp's is
    decided (below); one computed before the latest run is no longer current."""
    t = T0 + 20 * DAY
    base = example_recommendation(t)

    def rec(rec_id: str, saved: float, when: object = t, **target: str | None) -> Record:
        fields = {**base.target.model_dump(), "cluster": "c", **target}
        return base.model_copy(
            update={"id": rec_id, "saved_gpu_hours_per_week": saved, "computed_at": when,
                    "target": RecommendationTarget.model_validate(fields)}
        )  # fmt: skip

    k8s = {"kind": "k8s_workload", "scheduler": "kubernetes", "namespace": "robo",
           "owner_kind": "Job", "owner_name": "sim", "user": None, "account": None,
           "job_name": None, "partition": None}  # fmt: skip
    return [
        rec("rec-vision", 12.5, user="alice", account="vision"),
        rec("rec-robo", 3.0, **k8s),
        rec("rec-nlp", 7.0, user="carol", account="nlp"),
        rec("rec-stale", 99.0, t - DAY, user="bob", account="vision"),
    ]


@pytest.fixture
def november(clickhouse: ClickHouseSettings) -> ClickHouseSettings:
    store(clickhouse, [*estate(), *recommendations()])
    client = connect(clickhouse)
    try:
        decide(client, "rec-nlp", "accept", by="lead", why="done")
    finally:
        client.close()
    return clickhouse


def test_figures_ranks_and_details_are_the_hand_computed_ones(
    november: ClickHouseSettings,
) -> None:
    client = connect(november)
    try:
        reports = build(client, NOV, None, users=True, top=5)
    finally:
        client.close()
    teams = {s.name: s for s in reports if s.kind == "team"}
    users = {s.name: s for s in reports if s.kind == "user"}
    assert sorted(teams) == ["nlp", "robotics", "vision"]
    assert sorted(users) == ["alice", "bob", "carol", "dave", "erin"]
    expect = {"vision": (4.0, 1.2, 2.8), "nlp": (1.0, 0.0, 1.0), "robotics": (2.0, 1.9, 0.1)}
    for name, (alloc, used, gap) in expect.items():
        f = teams[name].figures
        assert (f.allocated_gpu_h, f.consumed_gpu_h, f.gap_gpu_h) == pytest.approx(
            (alloc, used, gap)
        ), name
    assert {n: str(s.rank) for n, s in teams.items()} == {
        "vision": "1st of 3", "nlp": "2nd of 3", "robotics": "3rd of 3"
    }  # fmt: skip
    v = teams["vision"]
    assert [(j.allocation_id, j.owner) for j in v.top_jobs] == [
        ("slurm/c/v2", "bob"), ("slurm/c/v1", "alice")
    ]  # fmt: skip
    assert [(m.owner, m.rank) for m in v.members] == [("bob", Rank(1, 2)), ("alice", Rank(2, 2))]
    # the days: v1 on the 2nd, v2 on the 15th, nothing else (October's o1 is not in it)
    busy = {i + 1: d.allocated_gpu_h for i, d in enumerate(v.daily) if d.allocated_gpu_h}
    assert busy == pytest.approx({2: 2.0, 15: 2.0}) and len(v.daily) == 30
    assert v.queue.waited == 2 and v.queue.mean_wait_s == pytest.approx(1200)
    assert v.queue.max_wait_s == pytest.approx(1800)
    assert v.queue.gpu_h_waited == pytest.approx(2 * 10 / 60 + 30 / 60)
    assert [r.id for r in v.recommendations] == ["rec-vision"]  # not the stale one
    assert [r.id for r in teams["robotics"].recommendations] == ["rec-robo"]  # its namespace
    assert teams["nlp"].recommendations == []  # decided
    robo = teams["robotics"].queue  # r1, r2 at once; the pod created 30 min before its binding
    assert (robo.waited, robo.max_wait_s, robo.gpu_h_waited) == (3, pytest.approx(1800), 0.5)
    assert robo.mean_wait_s == pytest.approx(600)
    assert teams["nlp"].queue.waited == 1 and teams["nlp"].queue.mean_wait_s == 0
    alice = users["alice"]
    assert alice.figures.gap_gpu_h == pytest.approx(1.0) and alice.rank is None
    assert [(m.team, str(m.rank)) for m in alice.members] == [("vision", "2nd of 2")]
    assert [r.id for r in alice.recommendations] == ["rec-vision"]
    assert [j.allocation_id for j in alice.top_jobs] == ["slurm/c/v1"]
    assert users["erin"].members[0].rank == Rank(1, 2)  # 0.1 gap beats dave's 0.0


def test_mails_go_to_named_teams_and_plain_users_once_each_with_who_sent_them(
    november: ClickHouseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    addresses = "vision=Vision leads <vision-leads@example.org>,nlp=nlp@example.org"
    with smtp_capture(tmp_path) as (port, ca, mails):
        environment(monkeypatch, november, port, ca, GPUGAP_MONTHLY_TEAM_ADDRESSES=addresses)
        args = ["monthly-report", "--month", "2026-11", "--team", "vision", "nlp", "--users"]
        assert main([*args, "--sent-by", "ops-lead"]) == 0
        assert "5 mail(s) sent by ops-lead" in capsys.readouterr().err
        assert main([*args, "--sent-by", "ops-lead"]) == 0  # a rerun: nothing twice
        assert "already sent to vision-leads@example.org" in capsys.readouterr().err
        assert main([*args, "--team", "robotics", "--sent-by", "ops-lead"]) == 0
        err = capsys.readouterr().err
        assert "team robotics: no address in GPUGAP_MONTHLY_TEAM_ADDRESSES" in err
        assert "2 mail(s) sent" in err  # robotics' users dave and erin; no team mail
        assert main(["monthly-report", "--month", "2026-11", "--team", "nlp", "--resend",
                     "--sent-by", "second look"]) == 0  # fmt: skip
    got = {tuple(m.recipients): m.message for m in mails}
    assert sorted(r for m in mails for r in m.recipients) == sorted(
        ["vision-leads@example.org", "nlp@example.org", "alice@example.org", "bob@example.org",
         "carol@example.org", "dave@example.org", "erin@example.org", "nlp@example.org"]
    )  # fmt: skip
    vision = got[("vision-leads@example.org",)]
    assert vision["To"] == "Vision leads <vision-leads@example.org>"
    assert (
        vision["Subject"] == "GPU-hours of team vision, November 2026: 2.8 idle, 1st of 3 by waste"
    )
    text, html, png, cid = parts(vision)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and f'src="cid:{cid.strip("<>")}"' in html
    assert "Rank by waste: 1st of 3 teams" in text and "slurm/c/v2 (bob, batch, c)" in text
    assert "rec-vision" in html and "rec-stale" not in html
    bob_text = parts(got[("bob@example.org",)])[0]
    assert "In team vision: 1.8 gap GPU-hours, rank 1st of 2 users by waste." in bob_text
    client = connect(november)
    try:
        rows = client.query(
            "SELECT sent_by, kind, subject_of, period, recipient, message_id FROM report_sends "
            "ORDER BY sent_at, recipient"
        ).result_rows
    finally:
        client.close()
    assert len(rows) == len(mails) == 8
    assert {r[:4] for r in rows if r[2] == "vision"} == {("ops-lead", "team", "vision", "2026-11")}
    assert rows[-1][:5] == ("second look", "team", "nlp", "2026-11", "nlp@example.org")
    nlp_ids = [r[5] for r in rows if r[2] == "nlp"]  # sent twice: the same Message-ID
    assert len(nlp_ids) == 2 and nlp_ids[0] == nlp_ids[1] == got[("nlp@example.org",)]["Message-ID"]


def test_a_dry_run_writes_every_report_and_sends_nothing(
    november: ClickHouseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environment(monkeypatch, november, 9, tmp_path / "none.pem")  # nothing listens on 9
    out = tmp_path / "out"
    assert main(["monthly-report", "--month", "2026-11", "--dry-run", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        f"team-{t}-2026-11{ext}" for t in ("nlp", "robotics", "vision")
        for ext in (".eml", ".html", ".png", ".txt")
    )  # fmt: skip
    msg = email.message_from_bytes(
        (out / "team-vision-2026-11.eml").read_bytes(), policy=email.policy.default
    )
    assert msg["To"] is None  # no address configured: written for another channel
    png = parts(msg)[2]
    assert png == (out / "team-vision-2026-11.png").read_bytes()
    assert 'src="team-vision-2026-11.png"' in (out / "team-vision-2026-11.html").read_text()
    empty = tmp_path / "january"  # a month with nothing: no report, no error
    assert main(["monthly-report", "--month", "2026-01", "--users", "--dry-run", str(empty)]) == 0
    assert list(empty.iterdir()) == []
    client = connect(november)
    try:
        assert client.query("SELECT count() FROM report_sends").result_rows == [(0,)]
    finally:
        client.close()


def test_bad_input_is_one_line_before_anything_is_sent(
    november: ClickHouseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    environment(monkeypatch, november, 9, tmp_path / "none.pem")
    dry = ["--dry-run", str(tmp_path / "d"), "--sent-by", "me"]
    cases = {
        ("--month", "2026-13"): "expected YYYY-MM",
        ("--month", "2026-11", "--team", "visoin"): "no allocations of team(s) 'visoin'",
        ("--month", "2026-11", "--top", "0"): "--top must be 1..50",
    }
    for args, said in cases.items():
        assert main(["monthly-report", *args, *dry]) == 2, args
        assert said in capsys.readouterr().err, args
    monkeypatch.setenv("GPUGAP_MONTHLY_TEAM_ADDRESSES", "vision=not an address")
    assert main(["monthly-report", "--month", "2026-11", *dry]) == 2
    assert "GPUGAP_MONTHLY_TEAM_ADDRESSES['vision']" in capsys.readouterr().err


def test_who_sends_is_the_os_user_unless_named_and_never_no_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpugap.report.monthly_send import who_sends

    monkeypatch.setenv("LOGNAME", "carol-op")  # what getpass reads first
    assert who_sends(None) == "carol-op" and who_sends(" the\nlead ") == "the lead"
    # a name that cleans to nothing is no one: refused before anything is read or sent
    assert main(["monthly-report", "--sent-by", " \t", "--dry-run", str(tmp_path / "d")]) == 2
    assert "pass --sent-by NAME" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
