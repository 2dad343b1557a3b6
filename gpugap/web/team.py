"""``GET /api/team_totals``, with sign-on on: the person's team over the last 30 days of data
(team_days, migration 022), what a user sees of their team beside their own jobs. The warehouse
narrows it to the person's team; an admin, unscoped, gets the estate's."""

from __future__ import annotations

from aiohttp import web

from gpugap.schemas.errors import GpugapError
from gpugap.web.decide import RunScoped
from gpugap.web.queries import Query
from gpugap.web.signon.roles import Person
from gpugap.web.signon.routes import PERSON_KEY

DAYS = 30
TOTALS = Query(
    "SELECT round(sum(allocated_gpu_h), 3) AS allocated_gpu_h, "
    "round(sum(consumed_gpu_h), 3) AS consumed_gpu_h, round(sum(gap_gpu_h), 3) AS gap_gpu_h, "
    "sum(allocations) AS allocations, min(day) AS since, max(day) AS until "
    "FROM v_team_daily WHERE day > (SELECT max(day) FROM team_days) - {days:UInt16}",
    {"days": DAYS},
)


def add_routes(app: web.Application, run: RunScoped) -> None:
    async def totals(request: web.Request) -> web.Response:
        person: Person = request[PERSON_KEY]
        try:
            columns, rows = await run(TOTALS, person.scope)
        except GpugapError as exc:
            return web.json_response({"error": str(exc)}, status=502)
        found = dict(zip(columns, rows[0], strict=True)) if rows else {}
        for day in ("since", "until"):
            found[day] = str(found[day]) if found.get(day) else None
        return web.json_response({"team": person.team, "days": DAYS, **found})

    app.router.add_get("/api/team_totals", totals)
