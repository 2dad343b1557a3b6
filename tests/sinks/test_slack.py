"""The Slack target against a real HTTP receiver: Block Kit within Slack's limits, hostile
names shown and never obeyed, the webhook URL never told, Slack's answers handled, and once
per alert state through Kafka (re-deliveries, restarts, refusals)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from gpugap.groundfloor.settings import KafkaSettings
from gpugap.groundfloor.text import clean, sql_string
from gpugap.schemas.errors import ConfigError, RetriableError
from gpugap.services.kafka import free_port
from gpugap.sinks.alerting import Refused
from gpugap.sinks.message import check_template, duration, mrkdwn, nodes
from gpugap.sinks.slack.settings import SlackSettings
from gpugap.sinks.slack.target import SlackTarget, payload
from tests.sinks.receivers import (
    A,
    B,
    HttpReceiver,
    alert,
    check_scenario,
    idle_alert,
    ledger_scenario,
)

SECRET_PATH = "/services/T0GPUGAP/B0ALERTS/xoxb-SECRET-TOKEN"
HOSTILE = "<!channel> <http://evil.example|click here> @here &amp;"


def settings(url: str, **fields: Any) -> SlackSettings:
    return SlackSettings(webhook_url=SecretStr(url), **fields)


def texts(node: Any) -> list[str]:
    """Every text a Slack client shows in the payload (the "text" values)."""
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "text" and isinstance(v, str)] + [
            t for v in node.values() for t in texts(v)
        ]
    if isinstance(node, list):
        return [t for v in node for t in texts(v)]
    return []


def test_needs_the_webhook_url_and_never_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUGAP_SLACK_WEBHOOK_URL", raising=False)
    with pytest.raises(ConfigError, match="GPUGAP_SLACK_WEBHOOK_URL"):
        SlackTarget(SlackSettings(), KafkaSettings())
    with pytest.raises(ConfigError, match="GPUGAP_SLACK_WEBHOOK_URL") as bad:
        SlackTarget(settings("hooks.slack.com" + SECRET_PATH), KafkaSettings())
    assert "SECRET" not in str(bad.value)
    with pytest.raises(ConfigError, match="GPUGAP_SLACK_EVIDENCE_URL"):
        SlackTarget(
            settings("https://x" + SECRET_PATH, evidence_url="https://g/{job}"), KafkaSettings()
        )
    target = SlackTarget(settings("https://hooks.slack.com" + SECRET_PATH), KafkaSettings())
    assert "SECRET" not in repr(target) and "SECRET" not in repr(target.settings)


def test_block_kit_shape_and_limits() -> None:
    nodes = tuple(f"node{i:03d}" for i in range(25))
    a = idle_alert(A, nodes=nodes, owner="a" * 200, team="t" * 300, message="m" * 4000)
    p = payload(a)
    assert set(p) == {"text", "blocks", "unfurl_links", "unfurl_media"}
    assert p["unfurl_links"] is False and p["unfurl_media"] is False
    header, facts, where = p["blocks"]
    assert header["type"] == "header" and header["text"]["type"] == "plain_text"
    assert 0 < len(header["text"]["text"]) <= 150
    assert (
        header["text"]["text"].startswith("GPUs idle: aaa") and "on prod" in header["text"]["text"]
    )
    assert facts["type"] == "section" and 1 <= len(facts["fields"]) <= 10
    for f in facts["fields"]:
        assert f["type"] == "mrkdwn" and f["verbatim"] is True and len(f["text"]) <= 2000
    shown = {f["text"].split("\n", 1)[0]: f["text"].split("\n", 1)[1] for f in facts["fields"]}
    assert list(shown) == [
        "*Who*", "*What*", "*How long*", "*GPU-hours wasted*", "*Class / scheduler*",
        "*Cluster*", "*Allocation*", "*Detail*",
    ]  # fmt: skip
    assert shown["*What*"].startswith("2 GPUs idle on 25 nodes: node000, node001")
    assert "node009 +15 more" in shown["*What*"] and "node010" not in shown["*What*"]
    assert shown["*Who*"].startswith("aaaa") and len(shown["*Who*"]) < 200
    assert shown["*GPU-hours wasted*"] == "0.50 GPU-h so far"
    assert shown["*Class / scheduler*"] == "batch / slurm"
    assert len(shown["*Detail*"]) <= 300
    assert where["type"] == "section" and where["text"]["verbatim"] is True
    assert f"alert_id = '{A}'" in where["text"]["text"] and "v_alerts" in where["text"]["text"]
    assert p["text"].startswith("GPUs idle: aaa")

    gang = alert(
        "partial_gang/prod/train-7/2026", kind="partial_gang", gang_id="train-7",
        pending_pods=3, running_pods=5, resolved_at=None,
    )  # fmt: skip
    p = payload(gang)
    assert p["blocks"][0]["text"]["text"] == "Partial gang: alice on prod"
    assert any("3 of 8 pods pending, 5 running (gang train-7)" in t for t in texts(p))
    done = payload(idle_alert(A, "resolved"))
    assert done["blocks"][0]["text"]["text"] == "Resolved: GPUs idle: alice on prod"
    span = "idle for 30 min; alert opened 2026-11-01 00:30 → resolved 01:15 UTC"
    assert f"*How long*\n{span}" in texts(done)


def test_hostile_names_are_shown_never_obeyed() -> None:
    # a node's name is one word in its normal form (schemas.types.Name): one with a newline is
    # a dead letter before any target sees it
    with pytest.raises(ValidationError, match="no whitespace or control"):
        idle_alert(A, nodes=("n\n*fake*",))
    a = idle_alert(A, owner=HOSTILE, team="<@U024BE7LH>", nodes=("<!here>", "n\u200b*fake*"))
    p = payload(a, "https://grafana.example/d/gpugap?var-alloc={allocation_id}&id={alert_id}")
    everything = texts(p)
    link = p["blocks"][2]["text"]["text"]
    for text in everything:
        for bad in ("<!", "<http" if text != link else "<http://evil", "<@", "@here", "evil|"):
            assert bad not in text, (bad, text)
    who = next(t for t in everything if t.startswith("*Who*"))
    assert "&lt;!channel&gt; &lt;http[:]//evil.example|click here&gt;" in who
    assert "&amp;amp;" in who and "&lt;@\u2060U024BE7LH&gt;" in who  # @ then a word joiner
    what = next(t for t in everything if t.startswith("*What*"))
    assert "n*fake*" in what  # the invisible character is not part of the name
    # the one link is ours, its values URL-quoted and & escaped
    assert link == (
        "<https://grafana.example/d/gpugap?var-alloc=slurm%2Fprod%2F4242&amp;id="
        "idle_gpu%2Fslurm%2Fprod%2F4242%2Fnode001%2Fa|Open the evidence>"
    )
    assert sum(t.count("<") for t in everything) == 1
    # a quote in an alert id cannot leave the query's string
    q = payload(idle_alert("x' OR 1=1 --"))["blocks"][2]["text"]["text"]
    assert "alert_id = 'x\\' OR 1=1 --'" in q


def test_answers_from_slack() -> None:
    async def scenario() -> None:
        async with HttpReceiver(path=SECRET_PATH) as r:
            target = SlackTarget(settings(r.url, timeout_s=0.3), KafkaSettings())
            await target.open()
            try:
                r.answer(200)
                assert await target.send(idle_alert(A)) == 200
                sent = r.requests[-1]
                assert sent.path == SECRET_PATH
                assert sent.headers["Content-Type"] == "application/json"
                assert sent.json()["blocks"][0]["type"] == "header"
                for status, body in [
                    (400, "invalid_payload"),
                    (403, "invalid_token"),
                    (404, "no_service"),
                    (410, "channel_is_archived"),
                ]:
                    r.answer((status, body))
                    with pytest.raises(Refused) as refused:
                        await target.send(idle_alert(A))
                    assert refused.value.code == status
                    assert refused.value.reason == f"the Slack webhook answered {status}: {body}"
                r.answer((400, "x" * 5000))
                with pytest.raises(Refused) as refused:
                    await target.send(idle_alert(A))
                assert len(refused.value.reason) < 400  # the answer is bounded
                for status in (429, 500, 502, 503):
                    r.answer(status)
                    with pytest.raises(RetriableError, match=f"answered {status}") as down:
                        await target.send(idle_alert(A))
                    assert "SECRET" not in str(down.value) and "127.0.0.1" not in str(down.value)
                r.delay_s = 1.0
                with pytest.raises(RetriableError, match=r"no answer within 0\.3s"):
                    await target.send(idle_alert(A))
            finally:
                await target.close()
        gone = SlackTarget(
            settings(f"http://127.0.0.1:{free_port()}{SECRET_PATH}"), KafkaSettings()
        )
        await gone.open()
        try:
            with pytest.raises(RetriableError, match="the Slack webhook: cannot connect") as down:
                await gone.send(idle_alert(A))
            assert "SECRET" not in str(down.value)
        finally:
            await gone.close()

    asyncio.run(scenario())


@pytest.mark.kafka
def test_once_per_alert_state_through_kafka(
    kafka: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def scenario() -> None:
        async with HttpReceiver(path=SECRET_PATH) as r:
            # B is owned by bob: this channel refuses it for good
            r.rules.append(lambda req: (410, "channel_is_archived") if b"bob" in req.body else None)
            first, second = await ledger_scenario(
                kafka, lambda: SlackTarget(settings(r.url), kafka), lambda: len(r.delivered)
            )
            check_scenario(first, second, "slack", 410)
            titles = sorted(q.json()["blocks"][0]["text"]["text"] for q in r.delivered)
            assert titles == [
                "GPUs idle: alice on prod",
                "GPUs idle: alice on prod",
                "Resolved: GPUs idle: alice on prod",
            ]
            assert sum(1 for q in r.delivered if B in q.body.decode()) == 0
            assert len(r.requests) == 4  # B tried once, refused; never again after a restart

    asyncio.run(scenario())
    assert "SECRET" not in caplog.text


def test_wording_helpers() -> None:
    assert [duration(timedelta(minutes=m)) for m in (0, 45, 125, 60 * 24 * 3 + 61)] == [
        "0 min",
        "45 min",
        "2 h 05 min",
        "3 d 1 h",
    ]
    assert clean("a\u202eb\u200bc\nd\te  f") == "a b c d e f"  # bidi, zero-width, lines
    assert clean("x" * 100, 10) == "x" * 9 + "…"
    assert (
        nodes(tuple(f"n{i}" for i in range(11))) == "n0, n1, n2, n3, n4, n5, n6, n7, n8, n9 +1 more"
    )
    assert mrkdwn("a & <b>", 9) == "a &amp; …"  # never cut inside an entity
    assert sql_string("it's a \\ \n http://x") == "'it\\'s a \\\\ \\x0A http\\x3A//x'"
    check_template("https://grafana.example/d/x?alloc={allocation_id}&c={cluster}", "S")
    for bad in ("https://g/{job}", "https://g/{0}", "https://g/{", "grafana/{alert_id}"):
        with pytest.raises(ConfigError, match="S="):
            check_template(bad, "S")
