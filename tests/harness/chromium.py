"""Debian's Chromium for the tests that drive a real browser (never one Playwright or a test
tool downloads): where it is, and the flags it runs with here (headless, as root, and with no
background networking: this machine's closed network refuses it many times a start)."""

from __future__ import annotations

import os
import shutil

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None
