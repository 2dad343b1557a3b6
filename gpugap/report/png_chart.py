"""A daily chart as a PNG, in pure Python (zlib and struct): bars for the GPU-hours allocated
each day, a line for those consumed (the gap is what of each bar stands above the line). The
monthly report mails it as an inline image; no plotting library is installed (nor worth one
for a chart like this).

Text in the image is only numbers (the y axis' grid values, the days of the month), drawn with
a 3x5 bitmap font; the words (title, legend) are the mail's HTML around the image. The size is
bounded (``MAX_SIDE`` pixels a side, ``MAX_DAYS`` days), so a chart never takes more memory
than a few hundred kilobytes.
"""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Sequence

MAX_SIDE = 2000
MAX_DAYS = 62
Color = tuple[int, int, int]
Point = tuple[int, int]
BACKGROUND: Color = (255, 255, 255)
GRID: Color = (225, 228, 232)
AXIS: Color = (120, 124, 130)
ALLOCATED: Color = (164, 190, 226)  # the bars: held
CONSUMED: Color = (217, 72, 15)  # the line: used
INK: Color = (60, 64, 70)

# 3x5 glyphs, one row of three bits per row: the digits and what grid labels need
_GLYPHS = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), "k": (4, 5, 6, 5, 5),
    "M": (5, 7, 7, 5, 5), " ": (0, 0, 0, 0, 0),
}  # fmt: skip


class Canvas:
    """An RGB image in memory, drawn on with rectangles, lines and numbers."""

    def __init__(self, width: int, height: int, background: Color = BACKGROUND) -> None:
        if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
            raise ValueError(f"a chart is 1..{MAX_SIDE} pixels a side, not {width}x{height}")
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def dot(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i : i + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill [x0, x1) x [y0, y1), clipped to the image."""
        x0, x1 = max(0, min(x0, x1)), min(self.width, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.height, max(y0, y1))
        row = bytes(color) * max(0, x1 - x0)
        for y in range(y0, y1):
            i = (y * self.width + x0) * 3
            self.pixels[i : i + len(row)] = row

    def line(self, start: Point, end: Point, color: Color, width: int = 2) -> None:
        """Bresenham's line, ``width`` pixels thick (a square pen)."""
        (x0, y0), (x1, y1) = start, end
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            self.rect(x0, y0, x0 + width, y0 + width, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, value: str, color: Color = INK, scale: int = 2) -> None:
        """``value`` (digits, '.', 'k', 'M', spaces) with its top left at (x, y)."""
        for ch in value:
            for row, bits in enumerate(_GLYPHS.get(ch, _GLYPHS[" "])):
                for col in range(3):
                    if bits & (4 >> col):
                        px, py = x + col * scale, y + row * scale
                        self.rect(px, py, px + scale, py + scale, color)
            x += 4 * scale

    def png(self) -> bytes:
        """The image as PNG: 8-bit RGB, every row unfiltered, one zlib stream."""
        stride = self.width * 3
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * stride : (y + 1) * stride]) for y in range(self.height)
        )
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 9))
            + _chunk(b"IEND", b"")
        )


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def text_width(value: str, scale: int = 2) -> int:
    return max(0, len(value) * 4 * scale - scale)


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``value`` (1 for nothing)."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10.0 * power


def label(value: float) -> str:
    """A grid value in at most five glyphs: 0.5, 25, 250, 2.5k, 25k, 1.2M."""
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e4:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def daily_chart(
    allocated: Sequence[float], consumed: Sequence[float], width: int = 720, height: int = 240
) -> bytes:
    """A PNG of one value pair per day (day 1 first): allocated as bars, consumed as a line
    over them; the y axis from 0 to a round number at or above the largest value."""
    if len(allocated) != len(consumed) or not 1 <= len(allocated) <= MAX_DAYS:
        raise ValueError(f"a daily chart takes 1..{MAX_DAYS} days, allocated and consumed alike")
    values = [max(0.0, v) if math.isfinite(v) else 0.0 for v in (*allocated, *consumed)]
    top = nice_ceiling(max(values))
    grid = [top * i / 4 for i in range(5)]
    left = max(text_width(label(g)) for g in grid) + 12
    right, above, below = 8, 10, 22
    canvas = Canvas(width, height)
    plot_w, plot_h = width - left - right, height - above - below
    if plot_w < len(allocated) or plot_h < 10:
        raise ValueError(f"{width}x{height} is too small for {len(allocated)} days")

    def y_of(v: float) -> int:
        v = max(0.0, v) if math.isfinite(v) else 0.0
        return above + plot_h - round(plot_h * min(v, top) / top)

    for g in grid:
        y = y_of(g)
        canvas.rect(left, y, left + plot_w, y + 1, GRID)
        text = label(g)
        canvas.text(left - 6 - text_width(text), y - 5, text, AXIS)
    slot = plot_w / len(allocated)
    bar = max(1, round(slot * 0.7))
    centres = []
    for day, value in enumerate(allocated):
        x0 = left + round(day * slot + (slot - bar) / 2)
        canvas.rect(x0, y_of(value), x0 + bar, above + plot_h, ALLOCATED)
        centres.append(x0 + bar // 2)
        number = str(day + 1)
        if day == 0 or (day + 1) % 5 == 0:  # 1, 5, 10, ...: readable at every width
            canvas.text(centres[-1] - text_width(number) // 2, above + plot_h + 6, number, AXIS)
    canvas.rect(left, above + plot_h, left + plot_w, above + plot_h + 1, AXIS)  # the x axis
    points = [(x, y_of(v)) for x, v in zip(centres, consumed, strict=True)]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        canvas.line((x0 - 1, y0 - 1), (x1 - 1, y1 - 1), CONSUMED)
    for x, y in points:
        canvas.rect(x - 2, y - 2, x + 3, y + 3, CONSUMED)
    return canvas.png()
