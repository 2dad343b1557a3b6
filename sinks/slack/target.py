"""``gpugap notify slack``: a message per alert opened and resolved, to a Slack incoming
webhook (or a compatible one: Mattermost, Rocket.Chat read the ``text`` fallback).

The message is Block Kit: a ``header`` (the title, plain text, at most 150 characters), a
``section`` with up to 10 ``fields`` (who, what, how long, GPU-hours wasted, class and
scheduler, cluster, allocation, detail; mrkdwn, each at most 2000 characters) and a
``section`` with where to look (``GPUGAP_SLACK_EVIDENCE_URL``, else the warehouse query).
``text`` is the one-line fallback notifications show.

Names from users (owner, team, nodes, gang) are bounded and escaped (``sinks.message``): an
owner called ``<!channel>`` is shown, not obeyed; every mrkdwn text is ``verbatim`` (Slack
does not turn bare URLs or channel names into links) and nothing is unfurled.

The webhook URL is a secret (whoever has it can post): it is never logged nor put into an
error; errors say "the Slack webhook". Answers: 200 is delivered; 429, 5xx, a refused
connection or a timeout are retried with backoff; other 4xx (``invalid_payload``,
``no_service``, ``channel_is_archived``...) refuse the alert: it is dead-lettered with Slack's
answer and the next one goes out.
"""

from __future__ import annotations

import json
from typing import Any

from gpugap.groundfloor.settings import KafkaSettings
from gpugap.schemas import Alert
from gpugap.schemas.errors import ConfigError
from gpugap.sinks.http import HttpTarget, http_url, post
from gpugap.sinks.message import check_template, describe, mrkdwn

from .settings import SlackSettings

#: Block Kit's limits
HEADER_MAX = 150
FIELDS_MAX = 10
FIELD_MAX = 2000
SECTION_MAX = 3000
#: what errors and logs call the receiver (its URL is a secret)
WHAT = "the Slack webhook"


def _text(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def payload(alert: Alert, evidence_url: str | None = None) -> dict[str, Any]:
    """The incoming-webhook payload for ``alert``: ``text`` and Block Kit ``blocks``."""
    m = describe(alert, evidence_url)
    fields = []
    for fact in m.facts[:FIELDS_MAX]:
        label = f"*{fact.label}*\n"
        fields.append(_text(label + mrkdwn(fact.value, FIELD_MAX - len(label))))
    if m.link.is_url:
        url = mrkdwn(m.link.text, SECTION_MAX - 40, code=True).replace("|", "%7C")
        where = f"<{url}|Open the evidence>"
    else:
        code = "`" not in m.link.text
        query = mrkdwn(m.link.text, SECTION_MAX - 40, code=code)
        where = f"In the warehouse (gpugap sql): {f'`{query}`' if code else query}"
    return {
        "text": mrkdwn(m.summary, SECTION_MAX),
        "blocks": [
            {
                "type": "header",
                # plain text is shown as it is; escaped all the same (the entities render)
                "text": {"type": "plain_text", "text": mrkdwn(m.title, HEADER_MAX)},
            },
            {"type": "section", "fields": fields},
            {"type": "section", "text": _text(where)},
        ],
        "unfurl_links": False,
        "unfurl_media": False,
    }


class SlackTarget(HttpTarget):
    """Each alert's open and resolve as a Block Kit message (the module's documentation)."""

    name = "slack"

    def __init__(self, config: SlackSettings, kafka: KafkaSettings, **batching: Any) -> None:
        secret = config.webhook_url.get_secret_value() if config.webhook_url else ""
        if not secret:
            raise ConfigError(
                "GPUGAP_SLACK_WEBHOOK_URL (or GPUGAP_SLACK_WEBHOOK_URL_FILE) is not set: the "
                "Slack incoming webhook to post alerts to"
            )
        self._url = http_url(secret, "GPUGAP_SLACK_WEBHOOK_URL", show=False)
        check_template(config.evidence_url, "GPUGAP_SLACK_EVIDENCE_URL")
        super().__init__(config, kafka, **batching)
        self.settings = config
        self.timeout_s = config.timeout_s

    def __repr__(self) -> str:
        return f"SlackTarget({WHAT})"

    async def send(self, alert: Alert) -> int | None:
        assert self._http is not None, "start() opens the HTTP session"
        body = json.dumps(payload(alert, self.settings.evidence_url)).encode()
        return await post(
            self._http,
            self._url,
            body,
            {"Content-Type": "application/json"},
            what=WHAT,
            timeout_s=self.settings.timeout_s,
            stop=self.stop,
        )
