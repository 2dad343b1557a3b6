"""The restart ledger (optional, ``GPUGAP_K8S_STATE_FILE``): which pods this producer has
reported and which of their events it sent, written atomically after each publisher flush.

Without it a restarted producer re-emits the events its first list shows, with the same
event ids (``k8s/<cluster>/<uid>/<kind>``) and times: downstream dedupes them by id. With it
the restart sends nothing already sent, and pods deleted while it was down (absent from the
first list) get their deletion event, which no stateless producer could know about.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from gpugap.schemas import K8sPodEvent, decode, encode
from gpugap.schemas.topics import K8S_PODS
from gpugap.schemas.types import PodEventKind

log = logging.getLogger(__name__)


class Ledger:
    def __init__(self, path: Path | None, cluster: str, every_s: float = 2.0) -> None:
        self.path, self.cluster, self.every_s = path, cluster, every_s
        self.pods: dict[str, tuple[set[PodEventKind], K8sPodEvent]] = {}
        self._dirty = False
        self._saved_at = 0.0

    def load(self) -> list[tuple[set[PodEventKind], K8sPodEvent]]:
        if self.path is None or not self.path.exists():
            return []
        try:
            doc = json.loads(self.path.read_bytes())
            if doc.get("cluster") != self.cluster:
                log.warning("ledger %s is for cluster %r: ignored", self.path, doc.get("cluster"))
                return []
            for entry in doc.get("pods", ()):
                event = decode(K8S_PODS, json.dumps(entry["event"]).encode())
                kinds = {PodEventKind(k) for k in entry["kinds"]}
                self.pods[event.uid] = (kinds, event)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ledger %s unreadable (%s): starting without it", self.path, exc)
            self.pods.clear()
        return list(self.pods.values())

    def note(self, event: K8sPodEvent) -> None:
        """Record an event that has been handed to the publisher (saved after its flush)."""
        if self.path is None:
            return
        self._dirty = True
        if event.kind is PodEventKind.DELETED:
            self.pods.pop(event.uid, None)
            return
        kinds = self.pods[event.uid][0] if event.uid in self.pods else set()
        kinds.add(event.kind)
        self.pods[event.uid] = (kinds, event)

    def save(self, force: bool = False) -> None:
        """Call only after the publisher flushed everything noted so far."""
        now = time.monotonic()
        if self.path is None or not self._dirty:
            return
        if not force and now - self._saved_at < self.every_s:
            return
        entries = [
            b'{"kinds":'
            + json.dumps(sorted(k.value for k in kinds)).encode()
            + b',"event":'
            + encode(event)
            + b"}"
            for kinds, event in self.pods.values()
        ]
        body = (
            b'{"version":1,"cluster":'
            + json.dumps(self.cluster).encode()
            + b',"pods":['
            + b",\n".join(entries)
            + b"]}\n"
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._dirty = False
        self._saved_at = now
