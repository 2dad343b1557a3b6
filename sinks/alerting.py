"""The base of alert targets: sinks of ``alerts.v1`` that tell people (Alertmanager, Slack,
webhooks, email). A target subclasses ``AlertTarget``, names itself and implements
``send(alert)``; the batching base (``sinks/base.py``) does the rest:

- **Once per direct target.** Each alert's open and resolve reach a direct target (Slack,
  a webhook, email) once, across restarts and Kafka's re-deliveries: every outcome is
  published on ``alerts.deliveries.v1`` before the alerts' offsets are committed, and a
  starting target reads that topic back as its ledger of what it already sent. (A crash
  between a target's answer and the ledger write re-sends that one alert: at-least-once.)
  Alertmanager is not direct (``direct = False``): it deduplicates alerts by their labels,
  and it is told about every state, updates included.
- **Retries and refusals.** ``send`` raises ``RetriableError`` when the target is down or
  overloaded (the base retries with backoff, nothing else is consumed meanwhile) and
  ``Refused`` when it refuses the alert for good (a 4xx, a bad address): the alert is
  dead-lettered with the reason and logged as refused, and the others go on.
- **Independent targets.** ``gpugap notify`` runs each target in its own consumer group, so
  a slow or broken target never holds back another.
- **Routing.** A target's settings (``sinks.routing.TargetSettings``) choose the alerts it
  gets: clusters, teams, classes, schedulers, kinds (empty: all).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, cast

from gpugap.kafka.consume import read_topic
from gpugap.settings import KafkaSettings, Settings
from schemas import Alert, AlertDelivery, Record, utc_now
from schemas.topics import ALERTS, DELIVERIES
from schemas.types import AlertState, DeliveryOutcome
from sinks.base import BatchingSink, Rejected
from sinks.routing import TargetSettings

log = logging.getLogger(__name__)


class Refused(Rejected):
    """The target refused this alert for a reason retrying cannot fix."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.code = code


class AlertTarget(BatchingSink):
    topics = (ALERTS,)
    #: delivered once per alert id and state (a person reads it); False: the target dedupes
    direct: ClassVar[bool] = True
    #: the states this target is told about
    states: ClassVar[frozenset[AlertState]] = frozenset({AlertState.OPEN, AlertState.RESOLVED})

    def __init__(self, config: TargetSettings, kafka: KafkaSettings, **batching: Any) -> None:
        batching.setdefault("max_age_s", 0.2)  # people wait for these, not a warehouse
        super().__init__(**batching)
        self.config = config
        self.kafka = kafka
        #: (alert_id, state) -> the delivery recorded for it, from the ledger and this run
        self.sent: dict[tuple[str, str], AlertDelivery] = {}
        #: alerts whose last delivered state is not resolved, by id (Alertmanager re-sends)
        self.active: dict[str, Alert] = {}
        self.delivered = 0
        self.refused = 0

    @classmethod
    def from_settings(cls, settings: Settings, config: Any, **batching: Any) -> AlertTarget:
        return cls(config, settings.kafka, **batching)

    async def send(self, alert: Alert) -> int | None:
        """Deliver one alert; return the target's status code (HTTP status, SMTP reply).
        Raise RetriableError (down, timeout, 5xx, 429) or Refused (4xx)."""
        raise NotImplementedError

    async def start(self) -> None:
        for d in await read_topic(self.kafka, DELIVERIES):
            if d.target == self.name:
                self._remember(d)

    def _remember(self, d: AlertDelivery) -> None:
        self.sent[d.alert_id, d.state.value] = d
        if d.state is AlertState.RESOLVED:
            # a refused resolve ends it too: re-sending the open state would revive it
            self.active.pop(d.alert_id, None)
        elif d.outcome is DeliveryOutcome.DELIVERED:
            self.active[d.alert_id] = d.alert

    async def write(self, batch: Sequence[Record]) -> None:
        for alert in cast(Sequence[Alert], batch):
            if alert.state not in self.states or not self.config.routes(alert):
                continue
            done = self.sent.get((alert.alert_id, alert.state.value))
            if done is not None and self.direct:
                if done.outcome is DeliveryOutcome.REFUSED:  # isolated and dead-lettered
                    raise Refused(done.detail, done.code)
                continue
            try:
                code = await self.send(alert)
            except Refused as exc:
                await self._record(alert, DeliveryOutcome.REFUSED, exc.code, exc.reason)
                self.refused += 1
                raise
            await self._record(alert, DeliveryOutcome.DELIVERED, code, "")
            self.delivered += 1
        assert self._dead_letters is not None
        await self._dead_letters.publisher.flush()  # the ledger is stored before the commit

    async def _record(
        self, alert: Alert, outcome: DeliveryOutcome, code: int | None, detail: str
    ) -> None:
        d = AlertDelivery(
            alert_id=alert.alert_id,
            state=alert.state,
            target=self.name,
            time=utc_now(),
            outcome=outcome,
            code=code,
            detail=detail[:4000],
            alert=alert,
        )
        self._remember(d)
        assert self._dead_letters is not None
        await self._dead_letters.publisher.send(DELIVERIES, d)
        if outcome is DeliveryOutcome.REFUSED:
            log.warning("%s refused alert %s (%s): %s", self.name, alert.alert_id, code, detail)
