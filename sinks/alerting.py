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
- **Reminders.** With ``GPUGAP_IDLE_REMIND_MINUTES`` (per class too), a direct target is
  told again, once per mark, when an alert it announced has been idle that long (an update
  record past the mark; a notifier that was down sends only the latest mark).
- **Routing.** A target's settings (``sinks.routing.TargetSettings``) choose the alerts it
  gets: clusters, teams, classes, schedulers, kinds (empty: all).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, cast

from gpugap.groundfloor.kafka.consume import read_topic
from gpugap.groundfloor.settings import KafkaSettings, Settings
from gpugap.schemas import Alert, AlertDelivery, Record, utc_now
from gpugap.schemas.topics import ALERTS, DELIVERIES
from gpugap.schemas.types import AlertState, DeliveryOutcome
from gpugap.sinks.base import BatchingSink, Rejected
from gpugap.sinks.routing import TargetSettings

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
        #: (alert_id, state, reminder mark or 0) -> its delivery, from the ledger and this run
        self.sent: dict[tuple[str, str, int], AlertDelivery] = {}
        #: idle minutes at which direct targets remind, per class ('' = none), for alerts
        #: that carry no policy (the stream's own marks, Alert.policy, come first)
        self.reminders: dict[str, tuple[int, ...]] = {}
        #: alerts whose last delivered state is not resolved, by id (Alertmanager re-sends)
        self.active: dict[str, Alert] = {}
        self.delivered = 0
        self.refused = 0

    @classmethod
    def from_settings(cls, settings: Settings, config: Any, **batching: Any) -> AlertTarget:
        target = cls(config, settings.kafka, **batching)
        target.reminders = settings.idle.reminders()
        return target

    async def send(self, alert: Alert) -> int | None:
        """Deliver one alert; return the target's status code (HTTP status, SMTP reply).
        Raise RetriableError (down, timeout, 5xx, 429) or Refused (4xx)."""
        raise NotImplementedError

    async def start(self) -> None:
        mine = await read_topic(self.kafka, DELIVERIES, keep=lambda d: d.target == self.name)
        for d in mine:
            self._remember(d)

    def _remember(self, d: AlertDelivery) -> None:
        self.sent[d.alert_id, d.state.value, d.reminder_minutes or 0] = d
        if d.state is AlertState.RESOLVED:
            # a refused resolve ends it too: re-sending the open state would revive it
            self.active.pop(d.alert_id, None)
        elif d.outcome is DeliveryOutcome.DELIVERED:
            self.active[d.alert_id] = d.alert

    async def write(self, batch: Sequence[Record]) -> None:
        for alert in cast(Sequence[Alert], batch):
            if not self.config.routes(alert):
                continue
            mark = self._reminder_due(alert) if self.direct else None
            if alert.state not in self.states and mark is None:
                continue
            done = self.sent.get((alert.alert_id, alert.state.value, mark or 0))
            if done is not None and self.direct:
                if done.outcome is DeliveryOutcome.REFUSED:  # isolated and dead-lettered
                    raise Refused(done.detail, done.code)
                continue
            try:
                code = await self.send(alert)
            except Refused as exc:
                await self._record(alert, DeliveryOutcome.REFUSED, exc.code, exc.reason, mark)
                self.refused += 1
                raise
            await self._record(alert, DeliveryOutcome.DELIVERED, code, "", mark)
            self.delivered += 1
        assert self._dead_letters is not None
        await self._dead_letters.publisher.flush()  # the ledger is stored before the commit

    def _reminder_due(self, alert: Alert) -> int | None:
        """The reminder mark an update record is due for (None: no reminder): the highest
        mark its idle minutes passed, for an alert whose open this target delivered and whose
        resolve it has not."""
        if alert.state is not AlertState.UPDATE:
            return None
        p = alert.policy
        if p is not None and (p.rule is not None or p.remind_minutes):
            marks = p.remind_minutes  # what the stream judged it by, a rule's marks included
        else:  # no marks from the stream (or an alert from before alerts carried a policy)
            marks = self.reminders.get(
                alert.workload_class.value if alert.workload_class else "", ()
            )
        due = [m for m in marks if alert.idle_minutes >= m]
        opened = self.sent.get((alert.alert_id, AlertState.OPEN.value, 0))
        if not due or opened is None or opened.outcome is not DeliveryOutcome.DELIVERED:
            return None
        if (alert.alert_id, AlertState.RESOLVED.value, 0) in self.sent:
            return None
        return max(due)

    async def _record(
        self,
        alert: Alert,
        outcome: DeliveryOutcome,
        code: int | None,
        detail: str,
        reminder: int | None = None,
    ) -> None:
        d = AlertDelivery(
            alert_id=alert.alert_id,
            state=alert.state,
            target=self.name,
            time=utc_now(),
            outcome=outcome,
            code=code,
            detail=detail[:4000],
            reminder_minutes=reminder,
            alert=alert,
        )
        self._remember(d)
        assert self._dead_letters is not None
        await self._dead_letters.publisher.send(DELIVERIES, d)
        if outcome is DeliveryOutcome.REFUSED:
            log.warning("%s refused alert %s (%s): %s", self.name, alert.alert_id, code, detail)
