"""The monthly report on the demo's day (tests/harness/demo_data.py): its figures equal what the
views say when asked another way (hourly rows, every row of v_queue_wait), its mails pass
through the real SMTP capture, and each mail's HTML, chart included, renders in Chromium
(a screenshot of each in the test's artifacts: its tmp dir, and $GPUGAP_ARTIFACTS when set)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpugap.cli import main
from gpugap.report.monthly import Month, build
from gpugap.report.monthly_mail import CHART_H, CHART_W
from gpugap.report.png_chart import ALLOCATED, CONSUMED
from gpugap.warehouse.client import connect
from tests.gpugap.monthly_mail import environment, parts, with_data_uri
from tests.harness.warehouse import DemoWarehouse
from tests.sinks.receivers import smtp_capture
from tests.web.conftest import artifacts, browser  # noqa: F401 (fixtures)

NOV = Month(2026, 11)
HOURS = "FROM v_capacity_gap WHERE hour >= '2026-11-01' AND hour < '2026-12-01'"

# the chart's colours as the browser decodes them: how many pixels of each the image holds
COUNT_COLOURS = """([img, colours]) => {
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d'); g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  return colours.map(([r, gr, b]) => {
    let n = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i] === r && d[i+1] === gr && d[i+2] === b) n++;
    return n;
  });
}"""


def test_figures_equal_the_views(demo_warehouse: DemoWarehouse) -> None:
    client = connect(demo_warehouse.settings)
    try:
        reports = build(client, NOV, None, users=True, top=3)
    finally:
        client.close()
    teams = {s.name: s for s in reports if s.kind == "team"}
    hourly = {
        team: (a, c, g)
        for team, a, c, g in demo_warehouse.rows(
            "SELECT team, sum(allocated_gpu_h), sum(consumed_gpu_h), sum(gap_gpu_h) "
            f"{HOURS} AND team != '' GROUP BY team"
        )
    }
    assert sorted(teams) == sorted(hourly) and len(teams) >= 3
    by_gap = sorted(hourly, key=lambda t: -hourly[t][2])
    for name, s in teams.items():
        f = s.figures
        assert (f.allocated_gpu_h, f.consumed_gpu_h, f.gap_gpu_h) == pytest.approx(hourly[name])
        assert s.rank is not None and s.rank.of == len(hourly)
        assert by_gap[s.rank.position - 1] == name  # no ties in the demo
        # the days add up to the month; the users to the team (less rows with no owner)
        assert sum(d.allocated_gpu_h for d in s.daily) == pytest.approx(f.allocated_gpu_h)
        no_owner = demo_warehouse.one(
            f"SELECT sum(gap_gpu_h) {HOURS} AND team = {{t:String}} AND owner = ''", t=name
        )
        members = sum(m.figures.gap_gpu_h for m in s.members)
        assert members + no_owner == pytest.approx(f.gap_gpu_h)
        jobs = {
            a: (o, g)
            for a, o, g in demo_warehouse.rows(
                f"SELECT allocation_id, any(owner), sum(gap_gpu_h) {HOURS} "
                "AND team = {t:String} GROUP BY cluster, allocation_id",
                t=name,
            )
        }
        for j in s.top_jobs:  # the most gap (equal gaps may come in either order)
            assert jobs[j.allocation_id] == (j.owner, pytest.approx(j.figures.gap_gpu_h))
        most = sorted((g for _, g in jobs.values()), reverse=True)[:3]
        assert [j.figures.gap_gpu_h for j in s.top_jobs] == pytest.approx(most)
        waits = [
            w
            for (w,) in demo_warehouse.rows(
                "SELECT wait_s FROM v_queue_wait WHERE team = {t:String} "
                "AND start_time >= '2026-11-01' AND start_time < '2026-12-01'",
                t=name,
            )
        ]
        assert s.queue.waited == len(waits)
        if waits:
            assert s.queue.mean_wait_s == pytest.approx(sum(waits) / len(waits))
            assert s.queue.max_wait_s == pytest.approx(max(waits))
    users = [s for s in reports if s.kind == "user"]
    assert users and all(s.figures == sum_of(s.members) for s in users)


def sum_of(members: list[Any]) -> Any:
    total = members[0].figures
    for m in members[1:]:
        total = total + m.figures
    return total


def test_the_mails_pass_the_smtp_capture_and_render_in_chromium(  # noqa: PLR0917 (fixtures)
    demo_warehouse: DemoWarehouse, browser: Any, artifacts: list[Path],  # noqa: F811
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    teams = [t for (t,) in demo_warehouse.rows("SELECT DISTINCT team FROM v_allocations")]
    addresses = ",".join(f"{t}={t}-lead@example.org" for t in teams if t)
    try:
        with smtp_capture(tmp_path) as (port, ca, mails):
            environment(
                monkeypatch, demo_warehouse.settings, port, ca,
                GPUGAP_MONTHLY_TEAM_ADDRESSES=addresses,
            )  # fmt: skip
            argv = ["monthly-report", "--month", "2026-11", "--users", "--sent-by", "demo-test"]
            assert main(argv) == 0
        sent = demo_warehouse.one("SELECT count() FROM report_sends WHERE sent_by = 'demo-test'")
    finally:  # the demo's warehouse is shared: leave it as it was
        demo_warehouse.admin.command("TRUNCATE TABLE report_sends")
    err = capsys.readouterr().err
    assert f"{len(mails)} mail(s) sent by demo-test, 0 failed" in err
    assert sent == len(mails) > len(teams)
    page = browser.new_page()
    try:
        for mail in mails:
            text, html, png, cid = parts(mail.message)
            (recipient,) = mail.recipients
            name = recipient.split("@")[0]
            assert "GPU-hours of" in text and "Per day (GPU-hours):" in text
            page.set_content(with_data_uri(html, png, cid))
            img = page.locator("img")
            page.wait_for_function("img => img.complete", arg=img.element_handle())
            size = img.evaluate("i => [i.naturalWidth, i.naturalHeight]")
            assert size == [CHART_W, CHART_H], name  # Chromium decoded the PNG
            bars, line = page.evaluate(COUNT_COLOURS, [img.element_handle(), [ALLOCATED, CONSUMED]])
            assert bars > 0 and line > 0, name
            shot = page.screenshot(full_page=True)
            for d in artifacts:
                (d / f"monthly-{name}.png").write_bytes(shot)
    finally:
        page.close()
    assert len(list(artifacts[0].glob("monthly-*.png"))) == len(mails)
