"""Deciding recommendations from the page, with sign-on on: ``GET /api/recommendations`` lists
what the person may see (the warehouse narrows it to their scope), ``POST /api/decide`` records
a lead's or an admin's accept, reject or defer in the audit trail (recommendation_decisions)
with the signed-in person as who decided, as ``gpugap recommend decide --by`` does.

Who may decide which: the person's own scope is asked whether the recommendation exists (a
lead sees the team's only: the engine's row policies), and only then is the decision written,
on a connection of its own as the warehouse's writer. A user (not a lead) may not decide. The
POST needs a same-origin request (``Sec-Fetch-Site`` or ``Origin``) and a JSON body: the session
cookie is SameSite=Lax, so another site's form never carries it anyway.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from gpugap.groundfloor.settings import ClickHouseSettings
from gpugap.schemas.errors import ConfigError, GpugapError
from gpugap.web.queries import Query
from gpugap.web.signon.roles import Person
from gpugap.web.signon.routes import PERSON_KEY

MAX_BODY = 4096
MAX_REASON = 2000
RunScoped = Callable[[Query, str | None], Awaitable[tuple[list[str], list[Any]]]]

LIST = Query(
    "SELECT id, kind, target, parameter, from_value, to_value, saved_gpu_h_per_week, "
    "confidence, decision, decided_by FROM v_recommendations WHERE current "
    "ORDER BY saved_gpu_h_per_week DESC, id LIMIT 200",
    {},
)
VISIBLE = "SELECT count() FROM recommendations WHERE id = {id:String}"


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, headers={"Cache-Control": "no-store"})


def same_origin(request: web.Request) -> bool:
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site == "same-origin"
    origin = request.headers.get("Origin")
    return origin is not None and urlsplit(origin).netloc == request.host


def add_routes(app: web.Application, writer: ClickHouseSettings, run: RunScoped) -> None:
    """The two routes on ``app``; ``run`` runs a query narrowed to a scope (Workers.run)."""

    async def listing(request: web.Request) -> web.Response:
        person: Person = request[PERSON_KEY]
        try:
            columns, rows = await run(LIST, person.scope)
        except GpugapError as exc:
            return _json({"error": str(exc)}, 502)
        return _json(
            {
                "columns": columns,
                "rows": [list(r) for r in rows],
                "may_decide": person.role in ("admin", "lead"),
            }
        )

    async def decide(request: web.Request) -> web.Response:
        person: Person = request[PERSON_KEY]
        if not same_origin(request):
            return _json({"error": "decide from the page itself"}, 403)
        if person.role not in ("admin", "lead"):
            return _json({"error": "a team's lead or an admin decides recommendations"}, 403)
        try:
            body = json.loads(await request.content.read(MAX_BODY + 1))
            if not isinstance(body, dict) or len(json.dumps(body)) > MAX_BODY:
                raise ValueError
            rec_id, decision = str(body["id"]), str(body["decision"])
            reason = str(body.get("why", ""))[:MAX_REASON]
        except (ValueError, KeyError, TypeError):
            return _json({"error": 'send JSON: {"id": ..., "decision": ..., "why": ...}'}, 400)
        try:
            _, rows = await run(Query(VISIBLE, {"id": rec_id[:128]}), person.scope)
        except GpugapError as exc:
            return _json({"error": str(exc)}, 502)
        if not rows or not rows[0][0]:
            return _json({"error": f"no recommendation {rec_id[:128]!r} for you"}, 404)
        try:
            made = await asyncio.to_thread(_write, writer, rec_id, decision, person, reason)
        except ConfigError as exc:
            return _json({"error": str(exc)}, 400)
        except GpugapError as exc:
            return _json({"error": str(exc)}, 502)
        return _json(made)

    app.router.add_get("/api/recommendations", listing)
    app.router.add_post("/api/decide", decide)


def _write(
    writer: ClickHouseSettings, rec_id: str, decision: str, person: Person, why: str
) -> dict[str, Any]:
    from gpugap.recommend.engine import decide
    from gpugap.warehouse.client import connect

    client = connect(writer)
    try:
        _, made = decide(client, rec_id, decision, by=person.user, why=why)
    finally:
        client.close()
    return {
        "id": made.id,
        "decision": made.decision,
        "decided_by": made.decided_by,
        "decided_at": made.decided_at.isoformat(),
    }
