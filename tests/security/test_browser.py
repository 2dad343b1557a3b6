"""A web page the operator opens, in a real browser (Debian's Chromium, headless), against an
endpoint without a password (``--insecure-no-password``; before, the local default): it loads
the endpoint's answers as a script and an image and posts to it, from another port of the
same host (the same site, another origin). The page never reads the warehouse nor changes it;
the endpoint's log shows the browser's requests were made, and refused."""

from __future__ import annotations

import http.server
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.harness.chromium import CHROMIUM_ARGS, chromium_path
from tests.harness.services import unavailable
from tests.security.conftest import Endpoint, describe, poll, running, unique

PAGE = """<!doctype html><html><body><div id="out">nothing read</div>
<script>
function leak(x) {{ document.getElementById("out").textContent = "LEAK" + "ED " + x; }}
</script>
<script src="{endpoint}/?query={script}"></script>
<img src="{endpoint}/?query={image}" onload="leak('image loaded')">
<script>
fetch("{endpoint}/", {{method: "POST", mode: "no-cors", body: "{write}"}});
fetch("{endpoint}/?query={script}", {{mode: "no-cors"}});
fetch("{endpoint}/?query={script}").then(r => r.text()).then(leak).catch(() => {{}});
</script></body></html>"""


def _chromium() -> str:
    found = chromium_path()
    if found is None:
        unavailable("Chromium is not installed (apt-get install chromium)")
        raise AssertionError  # (unavailable fails or skips)
    return found


@pytest.fixture
def open_endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    env = {"GPUGAP_CLICKHOUSE_PASSWORD": "", "GPUGAP_LOG_LEVEL": "INFO"}  # (the access log)
    with running(tmp_path, env, flags=["--insecure-no-password"]) as ep:
        yield ep


def _serve(page: str) -> tuple[http.server.HTTPServer, str]:
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, name="attack-page", daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/attack.html"


def test_a_web_page_on_this_host_cannot_read_or_change_the_warehouse(
    open_endpoint: Endpoint,
) -> None:
    ep = open_endpoint
    victim = unique("victim")
    created = ep.ask(f"CREATE TABLE {victim} (n UInt8) ENGINE = Memory", None)
    assert created.status_code == 200, describe(created)
    script = quote("SELECT concat('leak(\"', version(), '\")') FORMAT TSVRaw")
    page = PAGE.format(
        endpoint=ep.url,
        script=script,
        image=quote("SELECT 1 FORMAT TSVRaw"),
        write=f"DROP TABLE {victim}",
    )
    server, url = _serve(page)
    logged = ep.log.stat().st_size
    try:
        with tempfile.TemporaryDirectory(prefix="gpugap-chromium-") as profile:
            dom = subprocess.run(
                [_chromium(), *CHROMIUM_ARGS, f"--user-data-dir={profile}",
                 "--virtual-time-budget=10000", "--dump-dom", url],
                capture_output=True, text=True, timeout=120, check=False,
            ).stdout  # fmt: skip
    finally:
        server.shutdown()
    assert '<div id="out">nothing read</div>' in dom and "LEAKED" not in dom, dom[:300]
    still = ep.ask(f"SELECT count() FROM {victim}", None)
    assert still.status_code == 200 and still.text == "0\n", describe(still)
    # the browser did send them, and each got 403
    assert poll(lambda: ep.log.stat().st_size > logged, 5)
    log = ep.log.read_text(errors="replace")[logged:]
    sent = [line for line in log.splitlines() if '"GET /?query=' in line or '"POST / ' in line]
    assert len(sent) >= 3, log[-2000:]
    assert all(" 403 " in line for line in sent), "\n".join(sent)


def test_every_answer_says_nosniff(open_endpoint: Endpoint) -> None:
    import requests

    ep = open_endpoint
    for r in (
        requests.get(f"{ep.url}/ping", timeout=10),
        requests.get(f"{ep.url}/", timeout=10),
        requests.get(f"{ep.url}/play", timeout=10),
        ep.ask("SELECT 1", None),
        ep.ask("SELECT nonsense(", None),
        ep.ask("SELECT 1 FORMAT Native", None, params={"client_protocol_version": "54460"}),
    ):
        assert r.headers.get("X-Content-Type-Options") == "nosniff", (r.url, dict(r.headers))
