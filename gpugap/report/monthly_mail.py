"""The monthly report (monthly.py) as a person reads it: plain text, HTML with the daily chart
(png_chart.py), and one mail holding both: ``multipart/alternative`` of the text and a
``multipart/related`` of the HTML and the chart as an inline PNG (``cid:``), so a client that
shows HTML shows the chart, and one that does not shows the text.

Every name in it comes from records (team, owner, job ids, recommendation targets): each is
one clean, bounded line (groundfloor.text.clean), and HTML-escaped in the HTML. A mail's
``Message-ID`` is fixed per subject (team or user) and month, like the digest's.
"""

from __future__ import annotations

import hashlib
from email.message import EmailMessage
from email.utils import formatdate
from html import escape

from gpugap.groundfloor.text import NAME_MAX, clean
from gpugap.report.monthly import Figures, Subject
from gpugap.report.png_chart import ALLOCATED, CONSUMED, daily_chart

ID_MAX = 120
USERS_SHOWN = 25  # in a team's mail; the rest are counted
CHART_W, CHART_H = 720, 240


def _h(value: str, limit: int = NAME_MAX) -> str:
    return escape(clean(value, limit))


def duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def who(s: Subject) -> str:
    return f"team {clean(s.name)}" if s.kind == "team" else clean(s.name)


def title(s: Subject) -> str:
    """The mail's subject line (one clean line: no encoded word, no line break)."""
    gap = s.figures.gap_gpu_h
    if s.kind == "team":
        text = f"GPU-hours of {who(s)}, {s.month.title}: {gap:,.1f} idle, {s.rank} by waste"
    else:
        text = f"Your GPU-hours in {s.month.title}: {gap:,.1f} allocated but not used"
    return text.replace("=?", "= ?")  # the email target's header_text rule (CVE-2024-6923)


def message_id(s: Subject, domain: str) -> str:
    digest = hashlib.sha256(f"{s.kind}/{s.name}/{s.month.label}".encode()).hexdigest()[:32]
    return f"<gpugap.monthly.{s.kind}.{digest}@{domain}>"


def chart(s: Subject) -> bytes:
    return daily_chart(
        [d.allocated_gpu_h for d in s.daily], [d.consumed_gpu_h for d in s.daily], CHART_W, CHART_H
    )


def _totals(f: Figures) -> list[tuple[str, str, str]]:
    return [
        ("allocated", f"{f.allocated_gpu_h:,.1f}", "GPU-hours held by jobs and pods"),
        ("consumed", f"{f.consumed_gpu_h:,.1f}", f"{f.used:.0%} of what was measured"),
        ("gap", f"{f.gap_gpu_h:,.1f}", "allocated and measured, not used"),
        ("unmeasured", f"{f.unmeasured_gpu_h:,.1f}", "allocated with no samples: in no gap"),
    ]


def _standing(s: Subject) -> list[str]:
    if s.kind == "team":
        return [f"Rank by waste: {s.rank} teams (1st: the most gap GPU-hours)."]
    return [
        f"In team {clean(m.team)}: {m.figures.gap_gpu_h:,.1f} gap GPU-hours, "
        f"rank {m.rank} users by waste."
        for m in s.members
    ]


def _queue(s: Subject) -> str:
    q = s.queue
    if not q.waited:
        return "No job or pod of this month waited for GPUs (or none said when it was submitted)."
    return (
        f"{q.waited} jobs or pods started after waiting for GPUs: {duration(q.mean_wait_s)} on "
        f"average, {duration(q.max_wait_s)} at the longest; {q.gpu_h_waited:,.1f} GPU-hours "
        "waited (GPUs asked for x time waited)."
    )


def text(s: Subject) -> str:
    out = [f"GPU-hours of {who(s)} in {s.month.title} (UTC days)", ""]
    out += [f"  {name:<11}{value:>12}  {note}" for name, value, note in _totals(s.figures)]
    out += ["", *_standing(s), "", "Most wasteful jobs (gap GPU-hours):"]
    out += [
        f"  {j.figures.gap_gpu_h:>10,.1f}  {clean(j.allocation_id, ID_MAX)} "
        f"({clean(j.owner) or '-'}, {clean(j.workload_class, 20) or '-'}, {clean(j.cluster)})"
        for j in s.top_jobs
    ] or ["  none"]
    if s.kind == "team":
        out += ["", "Users by waste (rank, gap, allocated GPU-hours, used):"]
        out += [
            f"  {m.rank.position:>4}  {m.figures.gap_gpu_h:>10,.1f}  "
            f"{m.figures.allocated_gpu_h:>10,.1f}  {m.figures.used:>4.0%}  {clean(m.owner)}"
            for m in s.members[:USERS_SHOWN]
        ]
        if len(s.members) > USERS_SHOWN:
            out.append(f"  ... and {len(s.members) - USERS_SHOWN} more")
    out += ["", "Waiting for GPUs: " + _queue(s), "", "Open recommendations:"]
    out += [
        f"  saves {r.saved_gpu_h_per_week:,.1f} GPU-h/week: {clean(r.parameter, 40)} "
        f"{clean(r.from_value, 40)} -> {clean(r.to_value, 40)} for {clean(r.target, ID_MAX)} "
        f"(gpugap recommend show {clean(r.id, ID_MAX)})"
        for r in s.recommendations
    ] or ["  none open"]
    out += ["", "Per day (GPU-hours):", f"  {'day':<10}  {'allocated':>10}  {'consumed':>10}"]
    out += [
        f"  {d.isoformat():<10}  {f.allocated_gpu_h:>10,.1f}  {f.consumed_gpu_h:>10,.1f}"
        for d, f in zip(s.month.days, s.daily, strict=True)
    ]
    return "\n".join(out) + "\n"


_TD = 'style="padding:3px 10px;border-bottom:1px solid #e4e7eb;text-align:{}"'
_TH = 'style="padding:3px 10px;border-bottom:2px solid #9aa0a6;text-align:{}"'


def _table(head: list[str], rows: list[list[str]], right: int) -> str:
    """An HTML table whose first ``right`` columns are numbers (right-aligned)."""

    def align(i: int) -> str:
        return "right" if i < right else "left"

    th = "".join(f"<th {_TH.format(align(i))}>{h}</th>" for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(f"<td {_TD.format(align(i))}>{c}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f'<table style="border-collapse:collapse;font-size:14px"><tr>{th}</tr>{body}</table>'


def _swatch(color: tuple[int, int, int]) -> str:
    return (
        '<span style="display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;'
        f'background:rgb{color}"></span>'
    )


def html(s: Subject, image_src: str) -> str:
    """The report as an HTML document; ``image_src``: the chart's (``cid:...`` in the mail)."""
    rows = [[v, escape(n), escape(note)] for n, v, note in _totals(s.figures)]
    jobs = [
        [f"{j.figures.gap_gpu_h:,.1f}", f"{j.figures.allocated_gpu_h:,.1f}",
         f"{j.figures.used:.0%}", _h(j.allocation_id, ID_MAX), _h(j.owner) or "-",
         _h(j.workload_class, 20) or "-", _h(j.cluster)]
        for j in s.top_jobs
    ]  # fmt: skip
    parts = [
        f"<h2>GPU-hours of {escape(who(s))} in {s.month.title}</h2>",
        _table(["GPU-h", "", ""], rows, 1),
        *(f"<p><b>{escape(line)}</b></p>" for line in _standing(s)),
        f"<h3>Per day</h3><p>{_swatch(ALLOCATED)}allocated (bars){_swatch(CONSUMED)}"
        "consumed (line); the gap is each bar above the line. UTC days.</p>",
        f'<img src="{escape(image_src)}" width="{CHART_W}" height="{CHART_H}" '
        f'alt="GPU-hours allocated and consumed per day of {s.month.title}">',
        "<h3>Most wasteful jobs</h3>",
        _table(["gap GPU-h", "allocated", "used", "job", "owner", "class", "cluster"], jobs, 3)
        if jobs
        else "<p>None.</p>",
    ]
    if s.kind == "team":
        users = [
            [str(m.rank.position), f"{m.figures.gap_gpu_h:,.1f}",
             f"{m.figures.allocated_gpu_h:,.1f}", f"{m.figures.used:.0%}", _h(m.owner)]
            for m in s.members[:USERS_SHOWN]
        ]  # fmt: skip
        more = len(s.members) - USERS_SHOWN
        parts += [
            "<h3>Users by waste</h3>",
            _table(["rank", "gap GPU-h", "allocated", "used", "user"], users, 4),
            f"<p>... and {more} more</p>" if more > 0 else "",
        ]
    recs = [
        [f"{r.saved_gpu_h_per_week:,.1f}", _h(r.parameter, 40),
         f"{_h(r.from_value, 40)} &rarr; {_h(r.to_value, 40)}", _h(r.target, ID_MAX),
         f"<code>gpugap recommend show {_h(r.id, ID_MAX)}</code>"]
        for r in s.recommendations
    ]  # fmt: skip
    parts += [
        f"<h3>Waiting for GPUs</h3><p>{escape(_queue(s))}</p>",
        "<h3>Open recommendations</h3>",
        _table(["saves GPU-h/week", "change", "", "for", "details"], recs, 1)
        if recs
        else "<p>None open.</p>",
    ]
    body = "\n".join(p for p in parts if p)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{escape(title(s))}</title></head>\n"
        '<body style="font-family:Helvetica,Arial,sans-serif;color:#202124;max-width:760px">\n'
        f"{body}\n</body></html>\n"
    )


def compose(s: Subject, sender: str, to: str | None, domain: str) -> EmailMessage:
    """The mail: text, and HTML with the chart inline. ``to``: the To header (None: none,
    for a file written for another channel)."""
    msg = EmailMessage()
    msg["Subject"] = title(s)
    msg["From"] = sender
    if to:
        msg["To"] = to
    msg["Date"] = formatdate(usegmt=True)
    msg["Message-ID"] = message_id(s, domain)
    msg["Auto-Submitted"] = "auto-generated"
    cid = message_id(s, domain).replace("gpugap.monthly.", "chart.", 1)
    msg.set_content(text(s))
    msg.add_alternative(html(s, "cid:" + cid.strip("<>")), subtype="html")
    html_part = msg.get_payload()[1]  # type: ignore[index]
    assert isinstance(html_part, EmailMessage)  # the policy's part class: add_related works
    html_part.add_related(
        chart(s), "image", "png", cid=cid, disposition="inline", filename="gpu-hours-daily.png"
    )
    return msg
