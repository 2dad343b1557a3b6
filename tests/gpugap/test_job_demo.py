"""``gpugap job`` on the demo's day: for each scheduler's most wasteful allocation, the figures
equal the views (v_top_waste, v_capacity_gap per GPU, v_slurm_padding), by its allocation id
and, through the command, by the id its user knows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpugap.cli import main
from gpugap.job.models import JobReport
from gpugap.job.report import job_report
from tests.harness.warehouse import DemoWarehouse

GAP = """
SELECT allocated_gpu_h, consumed_gpu_h, gap_gpu_h, unmeasured_gpu_h
FROM v_top_waste WHERE cluster = {c:String} AND allocation_id = {a:String}
"""
DAILY = """
SELECT sum(measured_gpu_h), sum(idle_gpu_h)
FROM v_capacity_gap_daily WHERE cluster = {c:String} AND allocation_id = {a:String}
"""
HOURLY = """
SELECT gpu_uuid, sum(allocated_gpu_h), sum(consumed_gpu_h), sum(gap_gpu_h), sum(idle_gpu_h)
FROM v_capacity_gap WHERE cluster = {c:String} AND allocation_id = {a:String}
GROUP BY gpu_uuid ORDER BY gpu_uuid
"""


def _views_agree(wh: DemoWarehouse, r: JobReport) -> None:
    c, a = r.allocation.cluster, r.allocation.allocation_id
    f = r.figures
    want = wh.rows(GAP, c=c, a=a)[0] + wh.rows(DAILY, c=c, a=a)[0]
    got = (f.allocated_gpu_h, f.consumed_gpu_h, f.gap_gpu_h, f.unmeasured_gpu_h,
           f.measured_gpu_h, f.idle_gpu_h)  # fmt: skip
    assert got == tuple(round(float(v), 4) for v in want)
    per_gpu = {g.gpu_uuid: (g.allocated_gpu_h, g.consumed_gpu_h, g.gap_gpu_h, g.idle_gpu_h)
               for g in r.gpus}  # fmt: skip
    hourly = {
        row[0]: tuple(round(float(v), 4) for v in row[1:]) for row in wh.rows(HOURLY, c=c, a=a)
    }
    assert per_gpu == hourly
    if r.allocation.scheduler == "slurm" and r.allocation.end_time:
        pad = wh.rows("SELECT padding_gpu_h FROM v_slurm_padding WHERE cluster = {c:String} "
                      "AND allocation_id = {a:String}", c=c, a=a)  # fmt: skip
        assert r.padding is not None and r.padding.padding_gpu_h == round(float(pad[0][0]), 4)


def test_on_the_demo_the_figures_equal_the_views(
    demo_warehouse: DemoWarehouse, capsys: pytest.CaptureFixture[str]
) -> None:
    wh = demo_warehouse
    picks: list[Any] = []
    for scheduler in ("slurm", "kubernetes"):  # each scheduler's most wasteful allocation
        picks += wh.rows(
            "SELECT cluster, allocation_id FROM v_top_waste WHERE scheduler = {s:String} "
            "ORDER BY gap_gpu_h DESC, allocation_id LIMIT 1", s=scheduler,
        )  # fmt: skip
    assert len(picks) == 2, "the demo has no allocation of a scheduler"
    for cluster, aid in picks:
        r = job_report(wh.settings, aid, cluster)
        assert isinstance(r, JobReport), r
        _views_agree(wh, r)
        assert r.series is not None and r.series.points > 0
        # and by the id its user knows, through the command
        settings = wh.settings
        env = {"GPUGAP_CLICKHOUSE_URL": settings.url, "GPUGAP_CLICKHOUSE_USER": settings.user,
               "GPUGAP_CLICKHOUSE_DATABASE": settings.database}  # fmt: skip
        if settings.password is not None:
            env["GPUGAP_CLICKHOUSE_PASSWORD"] = settings.password.get_secret_value()
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            code = main(["job", r.allocation.job, "--cluster", cluster, "--format", "json"])
            out = capsys.readouterr().out
        assert code == 0, out
        assert json.loads(out)["figures"] == r.figures.model_dump(mode="json")
