"""Pages of ``gpugap web`` beyond the main one: ``/job?id=ID[&cluster=NAME]``, one allocation's
report for the person who ran it (``gpugap job``'s, from ``/api/job``). The page is a static
file (static/job.html, its script static/job.js): the id in the URL is read by the script
and sent to the API, which validates it; nothing of the request reaches the HTML."""

from __future__ import annotations

from aiohttp import web


def add_routes(app: web.Application, files: dict[str, bytes]) -> None:
    """GET /job on ``app``; ``files``: the page's assets by path under /static/
    (gpugap.web.server.assets)."""
    body = files["job.html"]

    async def job(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/html", charset="utf-8")

    app.router.add_get("/job", job)
