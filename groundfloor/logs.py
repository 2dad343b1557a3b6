"""Log records as one line each, whatever text they carry: a record's message is often made of
what a request, a record on a topic or an engine said (a query's comment, a job name), and a
newline in it would start a line of its own that reads as the program's. Control characters
in the message are escaped (``\\n`` as ``\\\\n``); a traceback keeps its lines, each
indented, so no line of it starts where a record does."""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
FORMAT = "%(levelname)s %(name)s: %(message)s"


def escape(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``)."""
    return _CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{ord(char):02x}")


class OneLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = escape(record.getMessage())
        head = self.formatMessage(_with_message(record, message))
        tail = []
        if record.exc_info:
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            tail.append(record.exc_text)
        if record.stack_info:
            tail.append(self.formatStack(record.stack_info))
        if not tail:
            return head
        lines = "\n".join(tail).splitlines()
        return head + "".join(f"\n    {escape(line)}" for line in lines)


def _with_message(record: logging.LogRecord, message: str) -> logging.LogRecord:
    copy = logging.makeLogRecord(record.__dict__)
    copy.message = message
    return copy


def configure(level: int | str = logging.WARNING) -> None:
    """The root logger's handler, writing to stderr in one line per record."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
