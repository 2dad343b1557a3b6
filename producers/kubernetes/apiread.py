"""Read-only GETs for the polled Kubernetes producers (capacity, queues): raw JSON by path,
lists read page by page, the API group's preferred version from discovery. Blocking (the
kubernetes client); the producers call it in a thread. Only GET is ever sent.

Answers are mapped to what a poller can act on: 404 is "not there" (None: a CRD that is not
installed), 403 is :class:`Forbidden` with the RBAC rule that would allow the request, anything
else non-2xx is :class:`ReadFailed` (the poll is skipped and tried again next interval).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

from gpugap.producers.kubernetes.bounds import DEAD_VALUE_BYTES
from gpugap.producers.kubernetes.producer import api_configuration
from gpugap.producers.kubernetes.settings import KubernetesSettings
from gpugap.schemas import DeadLetter, utc_now
from gpugap.schemas.errors import ConfigError
from gpugap.schemas.types import DeadLetterKind

log = logging.getLogger(__name__)
Obj = Mapping[str, Any]


class Forbidden(PermissionError):
    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"GET {path} is forbidden: the ClusterRole needs {rule}")
        self.rule = rule


class ReadFailed(RuntimeError):
    pass


def rbac_rule(group: str, resource: str) -> str:
    """The ClusterRole rule that allows a list (deploy/kubernetes-producer-rbac.yaml)."""
    return f'{{apiGroups: ["{group}"], resources: [{resource}], verbs: [get, list, watch]}}'


def client_config(kubeconfig: Any, context: str | None, env_prefix: str) -> Any:
    """The pod producer's client configuration rule (in-cluster, kubeconfig, KUBECONFIG),
    given only the two fields it reads; model_construct keeps GPUGAP_K8S_* out of it."""
    try:
        return api_configuration(
            KubernetesSettings.model_construct(kubeconfig=kubeconfig, context=context)
        )
    except ConfigError as exc:  # its hint names the pod producer's variable: name ours
        raise ConfigError(
            str(exc).replace("GPUGAP_K8S_KUBECONFIG", f"{env_prefix}KUBECONFIG")
        ) from None


def polled_dead_letter(
    topic: str, key: str, what: object, *, kind: DeadLetterKind, reason: str, consumer: str
) -> DeadLetter:
    """A dead letter for a record a poll could not publish (or published only in part):
    the object it came from (or what was left out) and why, keyed like the record."""
    raw = json.dumps(what, default=str).encode()[:DEAD_VALUE_BYTES]
    return DeadLetter(
        time=utc_now(),
        source_topic=topic,
        key_b64=base64.b64encode(key.encode()).decode(),
        value_b64=base64.b64encode(raw).decode(),
        kind=kind,
        reason=reason[:4000],
        consumer=consumer,
    )


class ReadOnlyApi:
    def __init__(self, configuration: Any, timeout: tuple[float, float]) -> None:
        from kubernetes.client import ApiClient

        self.client = ApiClient(configuration)
        self.timeout = timeout

    def get(
        self, path: str, query: Mapping[str, str | int] | None = None, *, rule: str = ""
    ) -> Any:
        """The JSON at ``path``; None when the server answers 404."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        url_path = f"{path}?{urlencode(query)}" if query else path
        method, url, headers, _, _ = self.client.param_serialize(
            method="GET", resource_path=url_path,
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
        )  # fmt: skip
        try:
            resp = self.client.call_api(
                method, url, header_params=headers, _request_timeout=self.timeout
            )
            status, body = resp.status, resp.read()
        except ApiException as exc:  # some client versions raise on non-2xx
            status, body = int(exc.status or 0), (exc.body or b"")
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # refused, reset, timed out
            raise ReadFailed(f"GET {path}: {exc}") from None
        if status == 404:
            return None
        if status in (401, 403):
            raise Forbidden(path, rule or "a rule that allows this GET")
        if not 200 <= status < 300:
            raise ReadFailed(f"GET {path}: HTTP {status}: {str(body)[:300]}")
        try:
            return json.loads(body)
        except ValueError:
            raise ReadFailed(f"GET {path}: the answer is not JSON") from None

    def list(
        self,
        path: str,
        *,
        page_size: int,
        limit: int,
        rule: str,
        query: Mapping[str, str] | None = None,
    ) -> Iterator[Obj]:
        """The items of a list, read ``page_size`` at a time, at most ``limit`` of them (a
        longer list is cut there and logged: memory stays bounded). Nothing when 404."""
        cont, seen = "", 0
        while True:
            params: dict[str, str | int] = {**(query or {}), "limit": page_size}
            if cont:
                params["continue"] = cont
            page = self.get(path, params, rule=rule)
            if page is None:
                return
            for item in page.get("items") or ():
                if seen >= limit:
                    log.error(
                        "%s: more than %d objects, read the first %d only", path, limit, limit
                    )
                    return
                seen += 1
                yield item
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return

    def preferred_version(self, group: str) -> str | None:
        """The version discovery prefers for ``group`` (the highest served: v1beta2 over
        v1beta1); None when no CRD of the group is installed."""
        found = self.get(f"/apis/{group}", rule=f"discovery of {group} (system:discovery)")
        if not isinstance(found, Mapping):
            return None
        version = (found.get("preferredVersion") or {}).get("version")
        return str(version) if version else None

    def close(self) -> None:
        self.client.close()
