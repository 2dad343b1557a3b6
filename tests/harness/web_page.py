"""The web page served from a thread of the test's own process (tests/web, benchmarks/web.py):
the same app ``gpugap web`` serves, on a free loopback port."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from aiohttp import web

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.web.server import make_app, serve_until, url_for
from gpugap.web.signon.settings import SignOnSettings


class Background:
    """The page served from a thread of its own (tests, benchmarks): ``.url``, ``.stop()``."""

    def __init__(
        self,
        settings: ClickHouseSettings,
        host: str = "127.0.0.1",
        port: int = 0,
        signon: SignOnSettings | None = None,
        routes: Callable[[web.Application], None] | None = None,
    ):
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.port = port
        self.error: BaseException | None = None

        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

            def started(p: int) -> None:
                self.port = p
                self._ready.set()

            app = make_app(settings, host, signon)
            if routes is not None:  # a test's own routes beside the page's
                routes(app)
            await serve_until(app, host, port, self._stop, started)

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:
                self.error = exc
                self._ready.set()

        self.url = ""
        self._thread = threading.Thread(target=run, name="gpugap-web", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self.error is not None:
            raise self.error
        self.url = url_for(host, self.port)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)
