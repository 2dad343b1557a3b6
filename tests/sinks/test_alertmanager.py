"""The Alertmanager target against a real Alertmanager v0.35.0 (harness/alertmanager.py) and the
real broker: open, update and resolve as Alertmanager shows them and as its webhook receiver
is notified; an HA set with a dead member; refusals; a restarted target re-sending what is
active; an Alertmanager that is down for a while."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from gpugap.groundfloor.kafka.consume import DeadLetters
from gpugap.groundfloor.kafka.publish import KafkaPublisher
from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import Alert, AlertDelivery, DeadLetter, utc_now
from gpugap.schemas.clock import parse_utc
from gpugap.schemas.errors import ConfigError, RetriableError
from gpugap.schemas.examples import gpu_uuid, one_of_each
from gpugap.schemas.topics import ALERTS, DEAD_LETTER, DELIVERIES
from gpugap.schemas.types import AlertKind, AlertState, DeliveryOutcome, WorkloadClass, format_utc
from gpugap.services.kafka import free_port
from gpugap.sinks.alerting import Refused
from gpugap.sinks.alertmanager.settings import AlertmanagerSettings
from gpugap.sinks.alertmanager.target import AlertmanagerTarget
from tests.harness.alertmanager import Alertmanager, WebhookReceiver
from tests.harness.topics import read_topic

pytestmark = pytest.mark.kafka

T = TypeVar("T")
EXAMPLE = one_of_each()["alerts.v1"]
assert isinstance(EXAMPLE, Alert)


def idle_alert(job: str, **update: Any) -> Alert:
    """An open idle alert of Slurm job ``job``, its episode begun 40 minutes ago."""
    now = utc_now()
    start = now - timedelta(minutes=40)
    fields: dict[str, Any] = {
        "alert_id": f"idle_gpu/slurm/prod/{job}/{format_utc(start)}",
        "allocation_id": f"slurm/prod/{job}",
        "time": now,
        "opened_at": now - timedelta(minutes=10),
        "owner": "alice",
        "team": "vision",
        "workload_class": WorkloadClass.BATCH,
        "nodes": ("node001",),
        "gpus": (gpu_uuid("node001", 0), gpu_uuid("node001", 1)),
        "idle_minutes": 40,
        "idle_gpu_hours": 1.25,
        "message": "",
    }
    fields.update(update)
    return Alert.model_validate(EXAMPLE.model_copy(update=fields).model_dump())


def settings(*urls: str, **kw: Any) -> AlertmanagerSettings:
    return AlertmanagerSettings(urls=list(urls), **kw)


async def eventually(
    check: Callable[[], Awaitable[T | None]],
    timeout_s: float = 15,
    why: Callable[[], str] = lambda: "",
) -> T:
    """The first truthy value ``check`` returns within ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout_s}s {why()}")
        await asyncio.sleep(0.1)


async def am_alerts(http: aiohttp.ClientSession, am: Alertmanager) -> dict[str, dict[str, Any]]:
    """What ``GET /api/v2/alerts`` lists (not resolved), by our alert_id label."""
    async with http.get(f"{am.url}/api/v2/alerts") as r:
        assert r.status == 200
        return {a["labels"].get("alert_id", ""): a for a in await r.json()}


def shown(http: aiohttp.ClientSession, am: Alertmanager, alert_id: str, **want: Any) -> Any:
    """A check: the alert as Alertmanager lists it, once its annotations include ``want``."""

    async def check() -> dict[str, Any] | None:
        a = (await am_alerts(http, am)).get(alert_id)
        if a is None or any(a["annotations"].get(k) != v for k, v in want.items()):
            return None
        return a

    return check


@asynccontextmanager
async def target_for(
    kafka: KafkaSettings, config: AlertmanagerSettings, **batching: Any
) -> AsyncIterator[AlertmanagerTarget]:
    """A started target whose ``write()`` the test drives, its ledger on the real broker."""
    async with KafkaPublisher(kafka) as pub:
        target = AlertmanagerTarget(config, kafka, **batching)
        target._dead_letters = DeadLetters(pub, "notify-alertmanager", kafka.topic_prefix)
        await target.start()
        try:
            yield target
        finally:
            await target.close()


@asynccontextmanager
async def running(
    kafka: KafkaSettings, target: AlertmanagerTarget
) -> AsyncIterator[AlertmanagerTarget]:
    """The target consuming alerts.v1 for real (``run()``, as ``gpugap notify`` runs it)."""
    async with KafkaPublisher(kafka) as pub:
        dead = DeadLetters(pub, "notify-alertmanager", kafka.topic_prefix)
        task = asyncio.create_task(target.run(kafka, dead, group="gpugap-notify-alertmanager"))
        try:
            yield target
        finally:
            target.stop.set()
            await asyncio.wait_for(task, 30)


@asynccontextmanager
async def stub(status: int, body: str) -> AsyncIterator[tuple[str, list[web.Request]]]:
    """An HTTP server answering every request with ``status``: (its base URL, the requests)."""
    seen: list[web.Request] = []

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        seen.append(request)
        return web.Response(status=status, text=body)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("urls", [(), ("ftp://am:9093",), ("http://am:port",)])
def test_bad_urls_are_config_errors(urls: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match="GPUGAP_ALERTMANAGER_URLS"):
        AlertmanagerTarget(settings(*urls), KafkaSettings())


def test_alert_object_is_bounded_and_escaped() -> None:
    """Untrusted names stay data: cut to bounds, quoted in the evidence link and the query."""
    target = AlertmanagerTarget(settings("http://am:9093"), KafkaSettings())
    odd = "o'neil\\x/{alert_id}&a=b"
    alert = idle_alert("9", owner="x" * 3000, team=odd, nodes=tuple(f"n{i}" for i in range(30)))
    alert = alert.model_copy(update={"alert_id": f"idle_gpu/{odd}/not-a-time"})
    obj = target.alert_object(alert)
    assert len(obj["labels"]["owner"]) == 1000 and obj["labels"]["team"] == odd
    assert obj["startsAt"] == format_utc(alert.opened_at)  # no time in the id: when it opened
    assert obj["annotations"]["nodes"].endswith("n19, +10 more")
    assert obj["annotations"]["evidence"] == (
        "SELECT * FROM v_alerts WHERE alert_id = 'idle_gpu/o\\'neil\\\\x/{alert_id}&a=b/not-a-time'"
    )
    linked = AlertmanagerTarget(
        settings("http://am:9093", evidence_url="https://g/d?id={alert_id}&c={cluster}"),
        KafkaSettings(),
    )
    link = linked.alert_object(alert)["annotations"]["evidence"]
    assert link == "https://g/d?id=" + quote(alert.alert_id, safe="") + "&c=prod"
    assert "&a=b" not in link and "'" not in link
    gang = alert.model_copy(
        update={
            "kind": AlertKind.PARTIAL_GANG,
            "gang_id": "ml/trainer",
            "allocation_id": None,
            "pending_pods": 1,
            "running_pods": 3,
            "state": AlertState.RESOLVED,
            "resolved_at": alert.opened_at - timedelta(hours=1),  # before the start
        }
    )
    obj = target.alert_object(gang)
    assert obj["labels"]["alertname"] == "GpuPartialGang"
    assert obj["labels"]["allocation"] == "ml/trainer"
    assert "3 pod(s) running, 1 pending" in obj["annotations"]["summary"]
    assert "so far" not in obj["annotations"]["summary"]
    assert len(obj["annotations"]["summary"]) < 700  # names cut, the facts kept
    assert obj["endsAt"] >= obj["startsAt"]  # Alertmanager refuses an end before the start
    with pytest.raises(ConfigError, match="EVIDENCE_URL"):
        AlertmanagerTarget(settings("http://am", evidence_url="https://g/{nope}"), KafkaSettings())


def test_open_update_resolve(
    kafka: KafkaSettings, alertmanager: Alertmanager, webhook: WebhookReceiver
) -> None:
    am = alertmanager
    opened = idle_alert("4242", message="2 GPUs idle\nfor 40 min")
    many = tuple(f"node{i:03d}" for i in range(25))
    updated = opened.model_copy(
        update={
            "state": AlertState.UPDATE,
            "idle_minutes": 55,
            "idle_gpu_hours": 2.5,
            "nodes": many,
            "time": utc_now(),
        }
    )
    resolved = updated.model_copy(
        update={"state": AlertState.RESOLVED, "resolved_at": utc_now(), "time": utc_now()}
    )
    aid = opened.alert_id

    async def scenario() -> None:
        async with (
            webhook.serving(),
            aiohttp.ClientSession() as http,
            target_for(kafka, settings(am.url, resend_interval_s=60)) as target,
        ):
            await target.write([opened])
            a = await eventually(shown(http, am, aid))
            assert a["status"]["state"] == "active"
            assert a["labels"] == {
                "alertname": "GpuIdle",
                "cluster": "prod",
                "scheduler": "slurm",
                "allocation": "slurm/prod/4242",
                "owner": "alice",
                "team": "vision",
                "workload_class": WorkloadClass.BATCH,
                "severity": "warning",
                "alert_id": aid,
            }
            ann = a["annotations"]
            assert ann["idle_minutes"] == "40"
            assert ann["idle_gpu_hours"] == "1.250"
            assert ann["gpus"] == "2"
            assert ann["nodes"] == "node001"
            assert ann["evidence"] == f"SELECT * FROM v_alerts WHERE alert_id = '{aid}'"
            summary = ann["summary"]
            assert "\n" not in summary
            assert summary.startswith("2 GPUs idle for 40 min")
            for fact in (
                "slurm/prod/4242",
                "alice",
                "vision",
                "2 GPU(s)",
                "40 min",
                "1.25 GPU-hours wasted so far",
            ):
                assert fact in summary, (fact, summary)
            # the episode's start, not when the alert opened; endsAt 4 re-send intervals on
            assert parse_utc(a["startsAt"]) == parse_utc(aid.rsplit("/", 1)[1])
            ahead = (parse_utc(a["endsAt"]) - utc_now()).total_seconds()
            assert 200 < ahead <= 240

            await eventually(lambda: _async(webhook.statuses(aid)))  # firing, before resolving
            await target.write([updated])
            a = await eventually(shown(http, am, aid, idle_minutes="55"))
            assert a["annotations"]["idle_gpu_hours"] == "2.500"
            nodes = a["annotations"]["nodes"].split(", ")
            assert nodes[:20] == list(many[:20]) and nodes[20:] == ["+5 more"]
            assert "2.50 GPU-hours wasted so far" in a["annotations"]["summary"]
            assert aid in target.active

            await target.write([resolved])
            assert aid not in target.active

            async def gone() -> bool:
                return aid not in await am_alerts(http, am)

            await eventually(gone)
            await eventually(lambda: _async("resolved" in webhook.statuses(aid)))
            statuses = webhook.statuses(aid)
            assert statuses[0] == "firing" and statuses[-1] == "resolved", statuses

    asyncio.run(scenario())
    ledger = asyncio.run(read_topic(kafka, DELIVERIES, 3))
    assert [(d.state, d.outcome, d.code, d.target) for d in ledger] == [
        (s, DeliveryOutcome.DELIVERED, 200, "alertmanager")
        for s in (AlertState.OPEN, AlertState.UPDATE, AlertState.RESOLVED)
    ]


async def _async(value: T) -> T:
    return value


def test_changed_labels_end_the_old_alert(kafka: KafkaSettings, alertmanager: Alertmanager) -> None:
    """Alertmanager tells alerts apart by their labels: an update with another owner is
    another alert there, so the one sent before is ended, not left to expire."""
    am = alertmanager
    opened = idle_alert("31337", owner="carol")
    moved = opened.model_copy(update={"state": AlertState.UPDATE, "owner": "dave"})

    async def scenario() -> None:
        async with (
            aiohttp.ClientSession() as http,
            target_for(kafka, settings(am.url)) as target,
        ):
            await target.write([opened])
            await eventually(shown(http, am, opened.alert_id))
            await target.write([moved])

            async def owners() -> list[str] | None:
                async with http.get(f"{am.url}/api/v2/alerts") as r:
                    found = sorted(a["labels"]["owner"] for a in await r.json())
                return found if found == ["dave"] else None

            await eventually(owners)

    asyncio.run(scenario())


def test_ha_set_with_a_dead_member(
    kafka: KafkaSettings, alertmanager: Alertmanager, caplog: pytest.LogCaptureFixture
) -> None:
    am = alertmanager
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    alert = idle_alert("77")
    config = settings(dead, am.url, bearer_token="tok-very-secret-1")

    async def scenario() -> None:
        async with (
            aiohttp.ClientSession() as http,
            target_for(kafka, config, max_backoff_s=1) as target,
        ):
            with caplog.at_level(logging.WARNING, logger="gpugap.sinks.alertmanager.target"):
                await target.write([alert])
            await eventually(shown(http, am, alert.alert_id))
            assert target.delivered == 1

    asyncio.run(scenario())
    warnings = [
        r
        for r in caplog.records
        if r.name == "gpugap.sinks.alertmanager.target" and r.levelno >= logging.WARNING
    ]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    text = warnings[0].getMessage()
    assert dead in text and am.url in text and alert.alert_id in text
    assert "tok-very-secret-1" not in caplog.text


def test_refused(kafka: KafkaSettings, alertmanager: Alertmanager) -> None:
    """A 4xx from every URL is a refusal: Refused with the code, the delivery logged as refused
    on alerts.deliveries.v1, the record dead-lettered (driven through ``run()``); a 4xx with a
    member down is worth retrying."""

    class Invalid(AlertmanagerTarget):
        """Sends what the real Alertmanager refuses with a 400: an end before the start."""

        def alert_object(self, alert: Alert, *, ended: bool = False) -> dict[str, Any]:
            obj = super().alert_object(alert, ended=ended)
            obj["endsAt"] = format_utc(parse_utc(obj["startsAt"]) - timedelta(hours=1))
            return obj

    bad = idle_alert("400")

    async def scenario() -> list[AlertDelivery]:
        async with KafkaPublisher(kafka) as pub:
            await pub.send(ALERTS, bad)
        async with running(kafka, Invalid(settings(alertmanager.url), kafka)) as target:
            await eventually(lambda: _async(target.refused), timeout_s=30)
        return await read_topic(kafka, DELIVERIES, 1)

    (d,) = asyncio.run(scenario())
    assert (d.alert_id, d.outcome, d.code) == (bad.alert_id, DeliveryOutcome.REFUSED, 400)
    assert "start time must be before end time" in d.detail
    (dl,) = asyncio.run(read_topic(kafka, DEAD_LETTER, 1))
    assert isinstance(dl, DeadLetter) and dl.reason.startswith("alertmanager: ")
    assert "start time must be before end time" in dl.reason

    async def stubs() -> None:
        async with (
            stub(400, '"invalid label set"') as (one, seen1),
            stub(422, "no") as (two, seen2),
            target_for(kafka, settings(one, two, bearer_token="tok-2")) as target,
        ):
            with pytest.raises(Refused) as refused:
                await target.write([idle_alert("401")])
            assert refused.value.code == 400 and "invalid label set" in refused.value.reason
            assert seen1[0].headers["Authorization"] == "Bearer tok-2"
            assert seen1[0].path == "/api/v2/alerts" and seen2[0].path == "/api/v2/alerts"
            dead = f"http://127.0.0.1:{free_port()}"
            target.endpoints = [f"{one}/api/v2/alerts", f"{dead}/api/v2/alerts"]
            with pytest.raises(RetriableError):
                await target.write([idle_alert("402")])

    asyncio.run(stubs())


def test_restarted_target_resends_active(
    kafka: KafkaSettings, alertmanager: Alertmanager, webhook: WebhookReceiver
) -> None:
    am = alertmanager
    interval = 1.5
    config = settings(am.url, resend_interval_s=interval)
    alert = idle_alert("5150")
    aid = alert.alert_id

    async def scenario() -> None:
        async with webhook.serving(), aiohttp.ClientSession() as http:
            async with target_for(kafka, config) as first:
                await first.write([alert])
            before = parse_utc((await eventually(shown(http, am, aid)))["endsAt"])

            # a new instance: its ledger read from alerts.deliveries.v1, alerts.v1 is empty
            second = AlertmanagerTarget(config, kafka)
            async with running(kafka, second):
                loop = asyncio.get_running_loop()
                began = loop.time()

                async def refreshed() -> bool:
                    a = (await am_alerts(http, am)).get(aid)
                    return a is not None and parse_utc(a["endsAt"]) > before

                await eventually(
                    refreshed,
                    interval + 10,
                    why=lambda: (
                        f"started: {second._session is not None}, ledger: "
                        f"{sorted(second.sent)}, resent: {second.resent}"
                    ),
                )
                assert second.delivered == 0 and second.resent >= 1
                assert aid in second.active
                # again and again, every interval
                await eventually(lambda: _async(second.resent >= 3), timeout_s=3 * interval + 5)
                assert loop.time() - began < 3 * interval + 10
                resolved_before = webhook.statuses(aid).count("resolved")

            # nobody re-sends it any more: it expires by itself 4 intervals on (resolved)
            await eventually(
                lambda: _async(webhook.statuses(aid).count("resolved") > resolved_before),
                4 * interval + 10,
            )
            assert aid not in await am_alerts(http, am)

    asyncio.run(scenario())


def test_busy_stream_does_not_starve_the_resend(
    kafka: KafkaSettings, alertmanager: Alertmanager
) -> None:
    """Writes one after the other (never an idle poll) still re-send the active alerts."""
    am = alertmanager
    quiet, busy = idle_alert("1"), idle_alert("2")
    interval = 1.0

    async def scenario() -> None:
        async with (
            aiohttp.ClientSession() as http,
            target_for(kafka, settings(am.url, resend_interval_s=interval)) as target,
        ):
            await target.write([quiet])
            first = parse_utc((await eventually(shown(http, am, quiet.alert_id)))["endsAt"])
            loop = asyncio.get_running_loop()
            until = loop.time() + 2.5 * interval
            n = 0
            while loop.time() < until:
                n += 1
                await target.write([busy.model_copy(update={"idle_minutes": 40 + n})])
                await asyncio.sleep(0.05)
            assert target.resent >= 2
            later = parse_utc((await am_alerts(http, am))[quiet.alert_id]["endsAt"])
            assert later > first

    asyncio.run(scenario())


def test_alertmanager_down_for_a_while(kafka: KafkaSettings, alertmanager: Alertmanager) -> None:
    """Alertmanager down for 60 s (the issue's case), the target retrying with the base's
    own backoff (up to 10 s) while nothing else is consumed: delivered once it is back."""
    am = alertmanager
    alert = idle_alert("8086")
    outage_s = 60.0

    async def scenario() -> AlertmanagerTarget:
        am.stop()
        async with KafkaPublisher(kafka) as pub:
            await pub.send(ALERTS, alert)
        target = AlertmanagerTarget(settings(am.url, timeout_s=2), kafka)
        async with aiohttp.ClientSession() as http, running(kafka, target):
            await eventually(lambda: _async(target.retries >= 1), timeout_s=30)
            await asyncio.sleep(outage_s)
            assert target.delivered == 0 and target.retries >= 5
            am.start()  # the same port; it forgot every alert (they live in memory)
            await eventually(shown(http, am, alert.alert_id), timeout_s=30)
            await eventually(lambda: _async(target.delivered), timeout_s=5)
        return target

    target = asyncio.run(scenario())
    assert target.refused == 0
    (d,) = asyncio.run(read_topic(kafka, DELIVERIES, 1, settle_s=0.5))
    assert (d.alert_id, d.outcome) == (alert.alert_id, DeliveryOutcome.DELIVERED)


def test_resolve_survives_a_frozen_alertmanager(
    kafka: KafkaSettings, alertmanager: Alertmanager, webhook: WebhookReceiver
) -> None:
    """Alertmanager frozen (SIGSTOP), not down: a re-send of the active alert times out here but
    waits there, the resolve is retried until it is accepted, and Alertmanager may handle the
    stale re-send after the resolve (its endsAt 4 intervals ahead, later than the resolve's:
    Alertmanager keeps it, the alert fires again). The alert must still end at the resolve
    time: notified resolved with that endsAt, not listed as active.

    Which of the requests that waited Alertmanager handles first is a race between its
    goroutines (a big re-send loses it to a small resolve); the test makes the stale one come
    last for certain by handing Alertmanager the very bytes of the unanswered re-send again
    once the resolve was accepted."""
    am = alertmanager
    # the stale re-send's endsAt (4 intervals on) must still be ahead when Alertmanager thaws:
    # once it has passed, Alertmanager keeps it over any earlier end (nothing can fix that)
    interval, timeout = 2.0, 0.5
    config = settings(am.url, resend_interval_s=interval, timeout_s=timeout)
    opened = idle_alert("6502")
    aid = opened.alert_id
    target = AlertmanagerTarget(config, kafka, max_backoff_s=0.5)
    unanswered: list[bytes] = []  # the bodies of the POSTs that got no answer
    post_one = target._post_one

    async def watched(endpoint: str, body: bytes) -> Any:
        answer = await post_one(endpoint, body)
        if answer.status is None:
            unanswered.append(body)
        return answer

    target._post_one = watched  # type: ignore[method-assign]

    def mine() -> list[dict[str, Any]]:
        """Alertmanager's notifications about the alert, in arrival order."""
        return [
            a
            for body in webhook.received
            for a in body.get("alerts", ())
            if a.get("labels", {}).get("alert_id") == aid
        ]

    async def scenario() -> None:
        async with (
            webhook.serving(),
            aiohttp.ClientSession() as http,
            KafkaPublisher(kafka) as pub,
            running(kafka, target),
        ):
            await pub.send(ALERTS, opened)
            await pub.flush()
            await eventually(shown(http, am, aid))
            await eventually(lambda: _async(target.resent >= 1))
            am.pause()
            try:
                # a re-send of the active alert is with Alertmanager, unanswered
                await eventually(lambda: _async(unanswered), timeout_s=5 * interval)
                stale = utc_now()  # its endsAt is at most 4 intervals on
                resolved = opened.model_copy(
                    update={
                        "state": AlertState.RESOLVED,
                        "resolved_at": utc_now(),
                        "time": utc_now(),
                    }
                )
                await pub.send(ALERTS, resolved)
                await pub.flush()
                await eventually(lambda: _async(target.retries >= 2), timeout_s=10)
            finally:
                am.resume()
            await eventually(lambda: _async(target.delivered >= 2), timeout_s=10)
            assert aid not in target.active
            end = resolved.resolved_at
            assert end is not None
            (resend,) = json.loads(unanswered[0])
            assert resend["labels"]["alert_id"] == aid and parse_utc(resend["endsAt"]) > end
            assert parse_utc(resend["endsAt"]) > utc_now() + timedelta(seconds=interval)
            # handled only now, after the resolve
            json_type = {"Content-Type": "application/json"}
            async with http.post(
                f"{am.url}/api/v2/alerts", data=unanswered[0], headers=json_type
            ) as r:
                assert r.status == 200

            # past the stale re-send's endsAt, and a group_interval (1 s) more for the last
            # notification
            ends = stale + timedelta(seconds=4 * interval + 1 + 0.5)

            async def settled() -> bool:
                if utc_now() < ends:
                    return False
                got = mine()
                return bool(got) and got[-1]["status"] == "resolved"

            await eventually(
                settled,
                timeout_s=20,
                why=lambda: f"notified: {[(a['status'], a['endsAt']) for a in mine()]}",
            )
            got = mine()
            last = got[-1]
            assert parse_utc(last["endsAt"]) == end, (
                format_utc(end),
                [(a["status"], a["endsAt"]) for a in got],
            )
            assert aid not in await am_alerts(http, am)

    asyncio.run(scenario())


def test_resolves_kept_for_stale_posts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Alerts with an unanswered POST and resolves kept to re-post: at most MAX_TRACKED each,
    the oldest forgotten first."""
    import gpugap.sinks.alertmanager.stale as module

    monkeypatch.setattr(module, "MAX_TRACKED", 3)
    target = AlertmanagerTarget(settings("http://am:9093", resend_interval_s=2), KafkaSettings())
    stale = target.stale
    stale.note_unanswered([f"a{i}" for i in range(5)], 0.0)
    assert list(stale.unanswered) == ["a2", "a3", "a4"]
    for i in range(5):
        obj = target.alert_object(idle_alert(str(i)), ended=True)
        stale.keep(f"a{i}", obj, 0.0, 1.0)
    assert [aid for aid, _ in stale.ended] == ["a2", "a3", "a4"]
    assert all(e.until == 0.0 + 4 * 2 + 10 for e in stale.ended.values())
    # once no stale POST can follow, nothing is kept, nor re-posted
    assert len(stale.due(1.0 + 1)) == 3 and stale.due(0.0 + 4 * 2 + 10 + 1) == []
    assert not stale.ended and not stale.unanswered
