"""List+watch of pods in a thread, through the official (blocking) kubernetes client.

One ``Watcher`` per namespace (or one for the whole cluster). It lists (in pages), then
watches from the list's resourceVersion with bookmarks on, and hands what the tracker makes of
each object to the event loop (``Handoff``). A 410 Gone (in the stream or as a status) means
the watch cannot resume: relist, and the tracker diffs the new list against what it knew
(vanished pods get a synthesised deletion). Every request carries ``_request_timeout``
(connect, read), so a hung connection raises within the read timeout; the watch then resumes
from the last resourceVersion it saw (a bookmark or an object), with backoff and jitter when
errors repeat. ``stop()`` sets a flag and shuts the socket of the stream in progress, so the
thread ends promptly (at most one read timeout when it is inside a request).

A pod object (listed or watched) that cannot be published, or a watch line that is not an
event, is a dead letter handed over with the batch it came in, and reading goes on past it:
retrying cannot change what the server sends, so a relist or a reconnection would only read
it again, for ever, and hold back every other pod.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpugap.producers.kubernetes.handoff import Batch, Handoff, Stopped
from gpugap.producers.kubernetes.stream import lines, parse_event, resource_version
from gpugap.producers.kubernetes.tracker import Tracker
from gpugap.schemas import K8sPodEvent
from gpugap.schemas.errors import MalformedRecord

log = logging.getLogger(__name__)


#: consecutive 401/403 answers, before the first list, that make the producer give up
REFUSALS = 3


class Expired(Exception):
    """410 Gone: the resourceVersion (or list continuation) is too old to resume from."""


@dataclass
class WatchOptions:
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    watch_timeout_s: int = 300
    page_size: int = 500
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 30.0
    once: bool = False


@dataclass
class Stats:
    lists: int = 0
    watches: int = 0
    expired: int = 0
    timeouts: int = 0
    errors: int = 0
    objects: int = 0
    last_error: str = ""
    started: float = field(default_factory=time.monotonic)


class Watcher(threading.Thread):
    def __init__(
        self,
        namespace: str | None,
        api_client: Any,
        tracker: Tracker,
        handoff: Handoff,
        opts: WatchOptions,
    ) -> None:
        super().__init__(name=f"k8s-watch-{namespace or 'all'}", daemon=True)
        from kubernetes.client import CoreV1Api

        self.namespace = namespace or ""
        self.api_client = api_client
        core = CoreV1Api(api_client)
        if namespace:
            self._list: Callable[..., Any] = lambda **kw: core.list_namespaced_pod(namespace, **kw)
        else:
            self._list = core.list_pod_for_all_namespaces
        self.tracker, self.handoff, self.opts = tracker, handoff, opts
        self.stopping = threading.Event()
        self.stats = Stats()
        self._resp: Any = None
        self._failures = 0
        #: the last resourceVersion read (object or bookmark): where a watch resumes
        self.rv: str | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def stop(self) -> None:
        self.stopping.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # already closed: nothing to unblock
                resp.shutdown()  # unblocks a read in progress in the watcher thread

    def run(self) -> None:
        try:
            self._loop()
        except Stopped:
            pass
        except BaseException as exc:  # handed to the event loop, which raises it
            with contextlib.suppress(Stopped):
                self.handoff.put(Batch(self.namespace, [], None, error=exc), self.stopping)
        finally:
            self.api_client.close()

    def _loop(self) -> None:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        listed_once = False
        refused = 0
        while not self.stopping.is_set():
            try:
                if self.rv is None:
                    self.rv = self._relist()
                    listed_once = True
                    if self.opts.once:
                        return
                self._watch(self.rv)
            except Expired:
                self.stats.expired += 1
                log.info("pods%s: 410 Gone, relisting", self._where)
                if self._failures:
                    self._backoff()  # a relist storm is an error too
                self._failures += 1
                self.rv = None
            except Stopped:
                return
            except ApiException as exc:
                # a restarted apiserver answers 403 until its RBAC caches are filled (seen on a
                # real one): refused several times in a row before any list is the real thing
                refused = refused + 1 if exc.status in (401, 403) else 0
                if refused >= REFUSALS and not listed_once:
                    raise PermissionError(
                        f"listing pods{self._where} was refused ({exc.status} {exc.reason}): "
                        "check the kubeconfig or the RBAC (deploy/kubernetes-producer-rbac.yaml)"
                    ) from None
                self._error(f"{exc.status} {exc.reason}")
            except Exception as exc:
                if self.stopping.is_set():
                    return
                if _timed_out(exc, urllib3.exceptions.TimeoutError):
                    self.stats.timeouts += 1  # a hung connection: resume from self.rv
                self._error(f"{type(exc).__name__}: {exc}")

    @property
    def _where(self) -> str:
        return f" in {self.namespace}" if self.namespace else ""

    def _error(self, what: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = what
        log.warning("pods%s: %s; reconnecting", self._where, what)
        self._backoff()

    def _backoff(self) -> None:
        self._failures += 1
        o = self.opts
        self.stopping.wait(backoff_delay(self._failures, o.backoff_initial_s, o.backoff_max_s))

    def _timeout(self) -> tuple[float, float]:
        return (self.opts.connect_timeout_s, self.opts.read_timeout_s)

    # --- list -----------------------------------------------------------------------------
    def _relist(self) -> str:
        self.stats.lists += 1
        self.tracker.begin_list()
        cont: str | None = None
        rv = ""
        while True:
            kw: dict[str, Any] = {"limit": self.opts.page_size}
            if cont:
                kw["_continue"] = cont
            body = self._get_json(**kw)
            meta = body.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            records: list[K8sPodEvent] = []
            for pod in body.get("items") or ():
                records += self.tracker.observe("ADDED", pod)
            self.stats.objects += len(body.get("items") or ())
            cont = meta.get("continue")
            if not cont:
                records += self.tracker.end_list()
                self._hand(Batch(self.namespace, records, rv, synced=True))
                return rv
            self._hand(Batch(self.namespace, records, None))

    def _hand(self, batch: Batch) -> None:
        batch.dead = self.tracker.take_dead()
        self.handoff.put(batch, self.stopping)

    def _get_json(self, **kw: Any) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self._list(_preload_content=False, _request_timeout=self._timeout(), **kw)
        except ApiException as exc:
            if exc.status == 410:
                raise Expired from None
            raise
        self._resp = resp
        try:
            body: dict[str, Any] = json.loads(resp.data)
            return body
        finally:
            self._resp = None
            resp.release_conn()

    # --- watch ----------------------------------------------------------------------------
    def _watch(self, rv: str) -> None:
        from kubernetes.client.exceptions import ApiException

        self.stats.watches += 1
        timeout_s = int(self.opts.watch_timeout_s * random.uniform(1.0, 2.0))
        try:
            resp = self._list(
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=rv,
                timeout_seconds=max(1, timeout_s),
                _preload_content=False,
                _request_timeout=self._timeout(),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise Expired from None
            raise
        self._resp = resp
        try:
            for chunk_lines in lines(resp):
                records: list[K8sPodEvent] = []
                for line in chunk_lines:
                    event = parse_event(line)
                    if event is None:
                        self.tracker.reject(
                            f"pods{self._where}: watch event after resourceVersion {self.rv}",
                            MalformedRecord("not a watch event (a JSON object with an object)"),
                            raw=line,
                        )
                        continue
                    etype, obj = event
                    if etype == "ERROR":
                        if obj.get("code") == 410:
                            raise Expired
                        raise ApiException(status=obj.get("code"), reason=obj.get("reason"))
                    if etype != "BOOKMARK":
                        self.stats.objects += 1
                        records += self.tracker.observe(etype, obj)
                    self.rv = resource_version(obj) or self.rv
                self._hand(Batch(self.namespace, records, self.rv))
                self._failures = 0
        finally:
            self._resp = None
            resp.release_conn()
            resp.close()
        if self.stopping.is_set():
            raise Stopped
        # the server ended the watch (timeoutSeconds): the loop resumes from self.rv


def backoff_delay(failures: int, initial_s: float, max_s: float) -> float:
    """Exponential backoff with jitter: the step doubles per failure up to ``max_s``; half
    of it is waited for sure, the other half at random (so many producers do not retry in
    lockstep after an API server restart)."""
    step = min(max_s, initial_s * 2 ** min(failures - 1, 30))
    return step / 2 + random.uniform(0, step / 2)


def _timed_out(exc: BaseException, urllib3_timeout: type[BaseException]) -> bool:
    """A read or connect timeout, bare or wrapped (urllib3's MaxRetryError.reason)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TimeoutError | urllib3_timeout):
            return True
        seen = getattr(seen, "reason", None) or seen.__cause__
        if not isinstance(seen, BaseException):
            return False
    return False
