"""``gpugap job`` as text for a terminal (100 columns; utilisation and memory over time as a
line of block characters per GPU) or JSON (job_models.py's)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from gpugap.job.models import Ambiguous, JobReport, Outcome, Series, Unknown
from gpugap.recommend.base import hms
from gpugap.report.render import WIDTH, gpu_h, pct, when
from gpugap.report.table import Col, table
from gpugap.schemas.errors import ConfigError

FORMATS = ("text", "json")
COLUMNS = 60  # characters per GPU over time
_BLOCKS = "▁▂▃▄▅▆▇█"
_NO_DATA = "·"


def render(outcome: Outcome, fmt: str = "text") -> str:
    if fmt == "json":
        return outcome.model_dump_json(indent=2)
    if fmt != "text":
        raise ConfigError(f"unknown --format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if isinstance(outcome, Unknown):
        return outcome.message
    if isinstance(outcome, Ambiguous):
        return "\n".join(ambiguous(outcome))
    return "\n".join(_text(outcome))


def ambiguous(a: Ambiguous) -> list[str]:
    shown = "" if a.matches <= len(a.candidates) else f" (the newest {len(a.candidates)})"
    rows = [
        [c.allocation_id, c.cluster, c.name, c.owner, str(c.gpus_requested), when(c.start_time),
         when(c.end_time), c.final_state or "running"]
        for c in a.candidates
    ]  # fmt: skip
    cols = [Col("allocation id"), Col("cluster"), Col("name"), Col("owner"),
            Col("GPUs", right=True), Col("start"), Col("end"), Col("state")]  # fmt: skip
    return [
        f"{a.id!r} names {a.matches} allocations{shown}: ask for one by its allocation id, "
        "or name its --cluster",
        *table(cols, rows),
    ]


def _wrap(text: str, indent: str, more: str = "  ") -> list[str]:
    """A long sentence on lines of WIDTH at most (commands are never wrapped)."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + more,
                         break_on_hyphens=False, break_long_words=False)  # fmt: skip


def _spark(values: Sequence[float | None], top: float) -> str:
    """Values in [0, top] as block characters, COLUMNS at most (each the mean of its span)."""
    n = len(values)
    width = min(n, COLUMNS)
    out = []
    for c in range(width):
        part = [v for v in values[c * n // width : (c + 1) * n // width] if v is not None]
        if not part or top <= 0:
            out.append(_NO_DATA)
            continue
        level = min(max(sum(part) / len(part) / top, 0.0), 1.0)
        out.append(_BLOCKS[round(level * (len(_BLOCKS) - 1))])
    return "".join(out)


def _over_time(s: Series) -> list[str]:
    if not s.points:
        return []
    span = s.points * s.step_s
    top = max((m for g in s.gpus for m in g.memory_mib if m), default=0.0)
    lines = [
        "",
        f"Over time, {when(s.start)} UTC + {hms(span)} in {s.step_s // 60}-minute buckets "
        f"({_BLOCKS[0]} none .. {_BLOCKS[-1]} all, {_NO_DATA} no data)",
    ]
    for g in s.gpus:
        lines.append(f"  {g.gpu_uuid[:24]:<24} {g.node:<12} util   {_spark(g.utilisation, 1.0)}")
    if top:
        lines.append(f"  memory, against the highest seen ({top / 1024:.1f} GiB):")
        for g in s.gpus:
            lines.append(f"  {g.gpu_uuid[:24]:<24} {g.node:<12} memory {_spark(g.memory_mib, top)}")
    return lines


def _head(r: JobReport) -> list[str]:
    a = r.allocation
    who = f"{a.owner or '-'} ({a.team or '-'})"
    where = f"partition {a.partition}" if a.partition else f"namespace {a.namespace or '-'}"
    lines = [
        f"gpugap job {a.job} · cluster {a.cluster} · {a.scheduler}",
        f"  {a.name or '-'} · {who} · {a.workload_class or '-'} · {where} · "
        f"{a.gpus_requested} GPU(s) on {', '.join(a.nodes) or '-'}",
        f"  allocation {a.allocation_id}",
    ]
    run = f"ran {when(a.start_time)} .. {when(a.end_time) if a.end_time else 'now'}"
    if a.elapsed_s is not None:
        run += f" ({hms(a.elapsed_s)}"
        run += f"; limit {hms(a.time_limit_s)})" if a.time_limit_s else ")"
    lines.append(f"  {run} · {a.final_state or 'running'}")
    return lines


def _figures(r: JobReport) -> list[str]:
    f = r.figures
    return [
        "",
        "GPU-hours (the views': v_capacity_gap_daily)",
        f"  allocated   {gpu_h(f.allocated_gpu_h):>10}",
        f"  measured    {gpu_h(f.measured_gpu_h):>10}   unmeasured {gpu_h(f.unmeasured_gpu_h)}"
        " (no telemetry: never counted idle or used)",
        f"  consumed    {gpu_h(f.consumed_gpu_h):>10}",
        f"  gap         {gpu_h(f.gap_gpu_h):>10}   {pct(f.gap_pct)} of measured",
        f"  idle        {gpu_h(f.idle_gpu_h):>10}   (below the idle threshold)",
    ]


def _gpus(r: JobReport) -> list[str]:
    if not r.gpus:
        return []
    cols = [Col("GPU"), Col("node"), Col("allocated", right=True), Col("consumed", right=True),
            Col("gap", right=True), Col("util", right=True), Col("idle", right=True),
            Col("peak", right=True), Col("peak memory", right=True), Col("needed")]  # fmt: skip

    def share(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    rows = [
        [g.gpu_uuid, g.node, gpu_h(g.allocated_gpu_h), gpu_h(g.consumed_gpu_h),
         gpu_h(g.gap_gpu_h), share(g.utilisation), share(g.idle_share), share(g.peak_activity),
         f"{g.peak_memory_mib / 1024:.1f} GiB" if g.peak_memory_mib else "-",
         "yes" if g.needed else "no"]
        for g in r.gpus
    ]  # fmt: skip
    return ["", "Per GPU (idle and util of measured time; peak: p99 of its hours' highest minute)",
            *table(cols, rows)]  # fmt: skip


def _idle(r: JobReport) -> list[str]:
    i = r.idle
    if i is None:
        return []
    share = pct(None if i.idle_share is None else 100 * i.idle_share)
    lines = [
        "",
        f"Idle stretches (minutes with every GPU idle): {i.idle_minutes} of "
        f"{i.measured_minutes} measured minutes ({share}) "
        f"in {i.stretches} stretch(es)",
    ]
    for s in i.longest:
        lines.append(
            f"  {when(s.start)} .. {s.end:%H:%M}  {s.minutes:>5} min  {gpu_h(s.gpu_h)} GPU-h"
        )
    return lines


def _waits(r: JobReport) -> list[str]:
    lines = []
    if r.padding:
        p = r.padding
        lines.append(
            f"Padding: limit {hms(p.time_limit_s)}, ran {hms(p.elapsed_s)} "
            f"({p.limit_ratio:.1f}x): {gpu_h(p.padding_gpu_h)} GPU-h held in the scheduler's "
            "plan and never used (v_slurm_padding)"
        )
    if r.queue:
        q = r.queue
        since = f" from {when(q.waiting_since)}" if q.waiting_since else ""
        gang = " (its gang waited as one)" if q.gang else ""
        lines.append(
            f"Queue: waited {hms(q.wait_s)}{since} in {q.queue or '-'}{gang}: "
            f"{gpu_h(q.gpu_h_waited)} GPU-h waited (v_queue_wait)"
        )
    return ["", *(w for line in lines for w in _wrap(line, "", "  "))] if lines else []


def _advice(r: JobReport) -> list[str]:
    lines = ["", "Advice" if r.advice else "Advice: none (it used what it asked for, as far as "
             "the rules see)"]  # fmt: skip
    for n, a in enumerate(r.advice, 1):
        lines.append(f"  {n}. {a.say}  (would have freed {gpu_h(a.saved_gpu_h)} GPU-h)")
        lines += [f"       {line}" for line in a.apply.splitlines()]
        lines += _wrap(f"why: {a.why}", "       ")
    if r.recommendations:
        lines += ["", "Open recommendations for its family (gpugap recommend show ID)"]
        for rec in r.recommendations:
            lines.append(
                f"  {rec.id}  {rec.parameter}: {rec.from_value} -> {rec.to_value}  "
                f"{rec.saved_gpu_h_per_week:.1f} GPU-h/week  confidence {rec.confidence:.2f}"
            )
    return lines


def _text(r: JobReport) -> list[str]:
    lines = [*_head(r), *_figures(r), *_gpus(r)]
    if r.series:
        lines += _over_time(r.series)
    lines += [*_idle(r), *_waits(r), *_advice(r)]
    if r.notes:
        lines += ["", *(f"note: {n}" for n in r.notes)]
    return lines
