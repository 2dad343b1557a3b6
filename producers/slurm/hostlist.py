"""Slurm hostlist expressions (``gpu[01-03,07],login1``) -> node names, in Slurm's order."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced brackets in hostlist {text!r}")
    parts.append("".join(cur))
    return [p for p in parts if p]


def _expand_one(name: str) -> list[str]:
    start = name.find("[")
    if start < 0:
        return [name]
    end = name.find("]", start)
    if end < 0:
        raise ValueError(f"unbalanced brackets in hostlist {name!r}")
    prefix, body, rest = name[:start], name[start + 1 : end], name[end + 1 :]
    out = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if m is None:
            raise ValueError(f"bad range {item!r} in hostlist {name!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo)  # zero padding is kept: node[01-03] -> node01..node03
        if int(hi) < int(lo) or int(hi) - int(lo) > 100_000:
            raise ValueError(f"bad range {item!r} in hostlist {name!r}")
        for n in range(int(lo), int(hi) + 1):
            out += [prefix + str(n).zfill(width) + tail for tail in _expand_one(rest)]
    return out


def expand(hostlist: str | None) -> list[str]:
    """``"a[1-2],b"`` -> ``["a1", "a2", "b"]``; empty, ``(null)`` or ``None assigned`` -> []."""
    text = (hostlist or "").strip()
    if text in ("", "(null)", "None assigned", "None"):
        return []
    out: list[str] = []
    for part in _split_top(text):
        out += _expand_one(part.strip())
    return out


def indices(text: str) -> tuple[int, ...]:
    """GRES index lists as Slurm prints them: ``"0-1,3"`` -> ``(0, 1, 3)``."""
    out: list[int] = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            continue
        m = _RANGE.match(item)
        if m is None:
            raise ValueError(f"bad GPU index list {text!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo or hi - lo > 4096:
            raise ValueError(f"bad GPU index range {item!r}")
        out += range(lo, hi + 1)
    return tuple(out)
