"""Kubernetes: scale a Deployment or StatefulSet through its ``scale`` subresource.

Uses the official ``kubernetes`` client (``pip install tokenplane[k8s]``):
``read_namespaced_{deployment,stateful_set}_scale`` and ``patch_namespaced_..._scale`` with the body
``{"spec": {"replicas": n}}`` (the client sends a dict as ``application/strategic-merge-patch+json``).
The client is synchronous; each call runs in a worker thread so the event loop never blocks.

Replicas and instances:

* ``start(n)`` sets ``spec.replicas`` to the current desired count plus ``n`` (at most
  ``max_replicas``); ``stop(ids)`` lowers it by ``len(ids)``, never below ``min_replicas``.
* ``list()`` reads the scale: ordinals below ``min(spec, status)`` are ``ready`` (the pod exists;
  the gateway's health probe is the real readiness gate), ``[status, spec)`` are ``starting`` and
  ``[spec, status)`` are ``stopping``. Handle ids are ``<name>-<ordinal>``.
* URLs: a StatefulSet's pods have stable names, so with ``url_pattern`` (for example
  ``http://{name}-{ordinal}.{name}-headless.{namespace}.svc.cluster.local:8000``; placeholders
  ``{name}``, ``{namespace}``, ``{ordinal}``) each handle carries its pod's URL through the headless
  Service, the loop registers pods with the gateway one by one, and scale-down removes the highest
  ordinals, which the loop drains first. A Deployment's pods have random names: replica counts only
  (no URLs; the gateway routes to the Deployment's Service and Kubernetes drains terminating pods
  through their ``preStop`` hook and grace period).

Errors: 429, 5xx, 409 and connection failures are retried ``retries`` times with exponential backoff
(``backoff_s`` doubling up to ``backoff_max_s``); anything else (403, 404, 422) raises
:class:`~tokenplane.control.errors.ScaleApiError` at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from tokenplane.control.actuators import InstanceHandle, InstanceState, kv
from tokenplane.control.errors import ActuatorError, ScaleApiError

log = logging.getLogger(__name__)

WorkloadKind = Literal["Deployment", "StatefulSet"]
RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
DEFAULT_RETRIES = 4
DEFAULT_BACKOFF_S = 0.5
DEFAULT_BACKOFF_MAX_S = 8.0


def _kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ActuatorError(
            "the Kubernetes actuator needs the 'k8s' extra: pip install tokenplane[k8s]"
        ) from exc
    return kubernetes


def load_api_client(
    *,
    host: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool = False,
) -> Any:
    """An ``ApiClient``: in-cluster service account, a kubeconfig, or a bare ``host`` (tests, proxies)."""
    k = _kubernetes()
    if host is not None:
        return k.client.ApiClient(k.client.Configuration(host=host))
    cfg = k.client.Configuration()
    if in_cluster:
        k.config.load_incluster_config(client_configuration=cfg)
    else:
        k.config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    return k.client.ApiClient(cfg)


class KubernetesActuator:
    """Scales one Deployment or StatefulSet; see the module docstring."""

    name = "kubernetes"

    def __init__(
        self,
        namespace: str,
        name: str,
        kind: WorkloadKind = "Deployment",
        api_client: Any = None,
        *,
        min_replicas: int = 0,
        max_replicas: int | None = None,
        url_pattern: str | None = None,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if kind not in ("Deployment", "StatefulSet"):
            raise ActuatorError(f"kind must be Deployment or StatefulSet, got {kind!r}")
        if url_pattern is not None:
            if kind != "StatefulSet":
                raise ActuatorError(
                    "url_pattern needs a StatefulSet: a Deployment's pods have no stable names"
                )
            if "{ordinal}" not in url_pattern:
                raise ActuatorError("url_pattern must contain {ordinal}")
        k = _kubernetes()
        self.namespace = namespace
        self.workload = name
        self.kind: WorkloadKind = kind
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.url_pattern = url_pattern
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._sleep = sleep
        self._api_exception: type[Exception] = k.client.exceptions.ApiException
        self.api = k.client.AppsV1Api(api_client if api_client is not None else load_api_client())
        suffix = "deployment" if kind == "Deployment" else "stateful_set"
        self._read = getattr(self.api, f"read_namespaced_{suffix}_scale")
        self._patch = getattr(self.api, f"patch_namespaced_{suffix}_scale")
        self._lock = asyncio.Lock()

    @property
    def tracks_instances(self) -> bool:
        return self.url_pattern is not None

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return await asyncio.to_thread(fn, *args)
            except self._api_exception as exc:
                status = getattr(exc, "status", None)
                if status not in RETRY_STATUSES or attempt == self.retries:
                    raise ScaleApiError(
                        f"{what} {self.kind}/{self.workload} in {self.namespace}: "
                        f"{status} {getattr(exc, 'reason', '')}",
                        status=status,
                    ) from None
                err = f"{status}"
            except Exception as exc:  # urllib3 connection errors and the like
                if attempt == self.retries:
                    raise ScaleApiError(
                        f"{what} {self.kind}/{self.workload}: {type(exc).__name__}: {exc}"
                    ) from None
                err = type(exc).__name__
            log.warning(
                "autoscaler k8s %s",
                kv(event="retry", op=what, error=err, attempt=attempt + 1, backoff_s=delay),
            )
            await self._sleep(delay)
            delay = min(self.backoff_max_s, delay * 2)
        raise AssertionError("unreachable")  # pragma: no cover

    async def read(self) -> tuple[int, int]:
        """``(spec.replicas, status.replicas)`` of the scale subresource."""
        scale = await self._call("read", self._read, self.workload, self.namespace)
        spec = int(getattr(scale.spec, "replicas", 0) or 0)
        status = int(getattr(scale.status, "replicas", 0) or 0) if scale.status is not None else 0
        return spec, status

    def _clamp(self, n: int) -> int:
        n = max(n, self.min_replicas)
        return min(n, self.max_replicas) if self.max_replicas is not None else n

    async def scale_to(self, replicas: int) -> int:
        """Patch ``spec.replicas`` (clamped to [min_replicas, max_replicas]); returns what was set."""
        target = self._clamp(replicas)
        await self._call("patch", self._patch, self.workload, self.namespace, {"spec": {"replicas": target}})
        log.info(
            "autoscaler k8s %s",
            kv(event="scaled", kind=self.kind, name=self.workload, ns=self.namespace, replicas=target),
        )
        return target

    def _handle(self, ordinal: int, state: InstanceState) -> InstanceHandle:
        url = None
        if self.url_pattern is not None:
            url = self.url_pattern.format(name=self.workload, namespace=self.namespace, ordinal=ordinal)
        return InstanceHandle(f"{self.workload}-{ordinal}", state, url)

    async def start(self, n: int) -> list[InstanceHandle]:
        async with self._lock:
            desired, _ = await self.read()
            target = self._clamp(desired + max(0, n))
            if target <= desired:
                return []
            await self.scale_to(target)
            return [self._handle(i, InstanceState.STARTING) for i in range(desired, target)]

    async def stop(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        async with self._lock:
            desired, _ = await self.read()
            target = self._clamp(desired - len(ids))
            if target < desired - len(ids) or target >= desired:
                log.warning(
                    "autoscaler k8s %s",
                    kv(event="floor", asked=desired - len(ids), min_replicas=self.min_replicas, set=target),
                )
            if target < desired:
                await self.scale_to(target)

    async def list(self) -> list[InstanceHandle]:
        desired, current = await self.read()
        out = []
        for i in range(max(desired, current)):
            if i < min(desired, current):
                state = InstanceState.READY
            elif i < desired:
                state = InstanceState.STARTING
            else:
                state = InstanceState.STOPPING
            out.append(self._handle(i, state))
        return out

    async def close(self) -> None:
        close = getattr(self.api.api_client, "close", None)
        if close is not None:
            await asyncio.to_thread(close)
