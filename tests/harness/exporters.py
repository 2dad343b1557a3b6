"""Local exporter endpoints for the scrapers' tests: one real HTTP server per name on
127.0.0.1 serving ``/metrics``, as dcgm-exporter, AMD's and Intel's exporters do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web


@asynccontextmanager
async def exporters(routes: Mapping[str, Any]) -> AsyncIterator[dict[str, str]]:
    """One HTTP server per name; a route is scrape text, an int (an HTTP status), a float
    (seconds to hang before answering) or a function giving the text at each request (a
    scenario that moves on between scrapes). Yields name -> /metrics URL."""
    runners, urls = [], {}

    def handler(what: Any) -> Callable[[web.Request], Any]:
        async def serve(request: web.Request) -> web.StreamResponse:
            if isinstance(what, int):
                return web.Response(status=what, text="exporter: internal error\n")
            if isinstance(what, float):
                await asyncio.sleep(what)
                return web.Response(text="# too late\n")
            text = what() if callable(what) else what
            return web.Response(text=text, content_type="text/plain")

        return serve

    try:
        for name, what in routes.items():
            app = web.Application()
            app.router.add_get("/metrics", handler(what))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            urls[name] = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
        yield urls
    finally:
        for runner in runners:
            await runner.cleanup()
