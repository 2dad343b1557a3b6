"""The monthly mail and its chart without a warehouse: names from records stay text (escaped,
one line, no header of their own), and the PNG is well formed and bounded. (Chromium decodes
the charts of real mails in test_report_monthly_demo.py.)"""

from __future__ import annotations

import email
import email.policy
import struct
import zlib

import pytest

from gpugap.report.monthly import Figures, Job, Member, Month, Rank, Subject
from gpugap.report.monthly_mail import compose, text
from gpugap.report.png_chart import MAX_DAYS, daily_chart, label, nice_ceiling
from tests.gpugap.monthly_mail import parts

HOSTILE = 'x<script>alert(1)</script>=?utf-8?q?=0D=0ABcc:_a@evil?= "&'


def subject() -> Subject:
    month = Month(2026, 2)
    f = Figures(10.0, 4.0, 5.0, 1.0)
    s = Subject("team", HOSTILE, month, f, Rank(3, 7))
    s.daily = [Figures(1.0, 0.5, 0.5) for _ in month.days]
    s.top_jobs = [Job("c", f"slurm/c/1{HOSTILE}", "bob\r\nBcc: x@evil", HOSTILE, "batch", f)]
    s.members = [Member(HOSTILE, "bob", f, Rank(1, 1))]
    return s


def test_names_from_records_stay_text() -> None:
    msg = compose(subject(), "gpugap <gpugap@example.org>", "t@example.org", "example.org")
    parsed = email.message_from_bytes(msg.as_bytes(), policy=email.policy.default)
    assert parsed["Bcc"] is None and "=?" not in str(parsed["Subject"]).replace("= ?", "")
    assert "3rd of 7 by waste" in parsed["Subject"]
    plain, html, png, _ = parts(parsed)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "Bcc: x@evil" not in plain.replace("bob Bcc: x@evil", "")  # one line, in its place
    assert len(plain.splitlines()) == len(text(subject()).splitlines())
    assert png.startswith(b"\x89PNG")
    assert (
        parsed["Message-ID"]
        == msg["Message-ID"]
        == compose(subject(), "gpugap <gpugap@example.org>", None, "example.org")["Message-ID"]
    )  # fixed per team and month


def test_the_png_is_well_formed_and_bounded() -> None:
    png = daily_chart([3.0] * 28, [1.0] * 28, 300, 120)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", png[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + data) == crc, kind
        chunks[kind] = data
        pos += 12 + length
    assert struct.unpack(">IIBB", chunks[b"IHDR"][:10]) == (300, 120, 8, 2)
    assert len(zlib.decompress(chunks[b"IDAT"])) == 120 * (1 + 300 * 3)
    for bad in (([], []), ([1.0], [1.0, 2.0]), ([1.0] * (MAX_DAYS + 1),) * 2):
        with pytest.raises(ValueError, match="daily chart"):
            daily_chart(*bad)
    with pytest.raises(ValueError, match="pixels a side"):
        daily_chart([1.0], [1.0], 5000, 100)
    with pytest.raises(ValueError, match="too small"):
        daily_chart([1.0] * 30, [1.0] * 30, 40, 100)
    assert daily_chart([float("nan")], [float("inf")], 100, 60).startswith(b"\x89PNG")


def test_grid_values_are_round_and_short() -> None:
    assert [nice_ceiling(v) for v in (0, 0.7, 1, 1.2, 3, 7.5, 2300)] == [1, 1, 1, 2, 5, 10, 2500]
    assert [label(v) for v in (0.5, 250, 2500, 25_000, 1_250_000)] == [
        "0.5", "250", "2500", "25k", "1.25M"
    ]  # fmt: skip
