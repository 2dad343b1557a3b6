"""``gpugap notify console``: each alert opened and resolved as one line on standard output,
worded as Slack and email word it (``sinks/message.py``), for a first look at what people
would be told. Delivered once per alert and state, like the other direct targets."""

from __future__ import annotations

import sys
from typing import ClassVar

from gpugap.schemas import Alert
from gpugap.sinks.alerting import AlertTarget
from gpugap.sinks.message import describe


class ConsoleTarget(AlertTarget):
    name: ClassVar[str] = "console"

    async def send(self, alert: Alert) -> int | None:
        m = describe(alert)
        facts = "; ".join(f"{f.label.lower()}: {f.value}" for f in m.facts[:4])
        sys.stdout.write(f"[alert] {m.title} — {facts}\n")
        sys.stdout.flush()
        return None
