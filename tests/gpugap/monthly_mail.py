"""What the monthly report's tests share: a real SMTP server (aiosmtpd with STARTTLS and AUTH,
tests/sinks/receivers.py) in a thread of its own while the command runs in the test's, the
environment that points gpugap at it and at a warehouse, and the parts of a captured mail."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from gpugap.groundfloor.settings import ClickHouseSettings


def environment(
    monkeypatch: pytest.MonkeyPatch, ch: ClickHouseSettings, port: int, ca: Path, **more: str
) -> None:
    env: dict[str, Any] = {
        "GPUGAP_EMAIL_HOST": "127.0.0.1",
        "GPUGAP_EMAIL_PORT": str(port),
        "GPUGAP_EMAIL_CAFILE": str(ca),
        "GPUGAP_EMAIL_USERNAME": "gpugap",
        "GPUGAP_EMAIL_PASSWORD": "s3cret-pw",
        "GPUGAP_EMAIL_SENDER": "gpugap <gpugap@example.org>",
        "GPUGAP_EMAIL_OWNER_DOMAIN": "example.org",
        "GPUGAP_CLICKHOUSE_URL": ch.url,
        "GPUGAP_CLICKHOUSE_DATABASE": ch.database,
        "GPUGAP_CLICKHOUSE_USER": ch.user,
        **more,
    }
    if ch.password is not None:
        env["GPUGAP_CLICKHOUSE_PASSWORD"] = ch.password.get_secret_value()
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def parts(msg: Any) -> tuple[str, str, bytes, str]:
    """(text, HTML, the chart's PNG, its Content-ID), checking the structure on the way:
    multipart/alternative of text/plain and multipart/related (text/html, image/png)."""
    assert msg.get_content_type() == "multipart/alternative"
    plain, related = msg.get_payload()
    assert plain.get_content_type() == "text/plain"
    assert related.get_content_type() == "multipart/related"
    html, image = related.get_payload()
    assert html.get_content_type() == "text/html" and image.get_content_type() == "image/png"
    assert image.get_content_disposition() == "inline"
    return plain.get_content(), html.get_content(), image.get_content(), image["Content-ID"]


def with_data_uri(html: str, png: bytes, cid: str) -> str:
    """The HTML with its cid: reference as the image itself, for a browser."""
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    return html.replace("cid:" + cid.strip("<>"), uri)
