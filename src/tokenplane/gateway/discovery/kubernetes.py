"""``discovery: {kind: kubernetes}``: ready pods matching a label selector in a namespace.

A pod is served when it is Running with the ``Ready`` condition true, has a pod IP, carries no
``deletionTimestamp`` and names its model. Everything else about the instance comes from the pod:

=================================  ===========================================================
``tokenplane.io/model``            label or annotation, required: the configured model it serves
``tokenplane.io/kind``             label or annotation, default ``vllm`` (vllm, sglang, emulated)
``tokenplane.io/gpu``              label or annotation, e.g. ``H100``
``tokenplane.io/price-per-hour``   annotation, dollars per hour (cost attribution)
``tokenplane.io/port``             annotation; else the container port named ``port_name``
                                   (``http`` by default); else the first container port
``tokenplane.io/max-concurrency``  annotation, requests the gateway sends it at once
=================================  ===========================================================

The instance id is the pod's name. The source lists the pods (``GET /api/v1/namespaces/NS/pods``),
then watches from the list's ``resourceVersion`` (``?watch=1&resourceVersion=&allowWatchBookmarks``);
each event (ADDED, MODIFIED, DELETED, BOOKMARK) moves the resourceVersion on, so a watch that ends
(its ``timeoutSeconds``) resumes where it stopped. A ``410 Gone`` (an ERROR event or the status)
means that version is compacted away: list again. A failed call (the API server away, a reset
connection) is retried with exponential backoff (``backoff_s`` doubling up to ``backoff_max_s``),
resuming from the last version; the instances in use stay served meanwhile.

Uses the official ``kubernetes`` client (``pip install tokenplane[k8s]``) for configuration and auth
(in-cluster service account, a kubeconfig, or a bare ``api_host``); the client is synchronous, so
the calls run in a worker thread, reading the watch's JSON lines raw. RBAC: ``list`` and ``watch``
on ``pods`` (deploy/kubernetes/base/rbac.yaml).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from tokenplane.control.k8s import load_api_client
from tokenplane.gateway.config import InstanceConfig, KubernetesDiscoveryConfig
from tokenplane.gateway.discovery.base import PoolSync

log = logging.getLogger("tokenplane.gateway.discovery")

PREFIX = "tokenplane.io/"


class Gone(Exception):
    """410: the resourceVersion is too old; list again."""


def _meta(pod: dict[str, Any], key: str) -> str | None:
    md = pod.get("metadata") or {}
    for where in ("annotations", "labels"):
        v = (md.get(where) or {}).get(PREFIX + key)
        if v is not None:
            return str(v)
    return None


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    if not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def _port(pod: dict[str, Any], port_name: str) -> int | None:
    annotated = _meta(pod, "port")
    if annotated is not None:
        return int(annotated)
    ports = [p for c in (pod.get("spec") or {}).get("containers") or () for p in c.get("ports") or ()]
    for p in ports:
        if p.get("name") == port_name:
            return int(p["containerPort"])
    return int(ports[0]["containerPort"]) if ports else None


def instance_of(pod: dict[str, Any], port_name: str) -> InstanceConfig | None:
    """The instance a ready pod serves, or ``None`` (not ready, or no model or port)."""
    name = (pod.get("metadata") or {}).get("name")
    model = _meta(pod, "model")
    if not name or model is None or not _ready(pod):
        return None
    try:
        port = _port(pod, port_name)
        if port is None:
            log.warning("discovery: pod %s has no port (annotation %sport or a container port)", name, PREFIX)
            return None
        fields: dict[str, Any] = {
            "id": name,
            "url": f"http://{pod['status']['podIP']}:{port}",
            "model": model,
        }
        if (kind := _meta(pod, "kind")) is not None:
            fields["kind"] = kind
        if (gpu := _meta(pod, "gpu")) is not None:
            fields["gpu"] = gpu
        if (price := _meta(pod, "price-per-hour")) is not None:
            fields["price_per_hour"] = float(price)
        if (conc := _meta(pod, "max-concurrency")) is not None:
            fields["max_concurrency"] = int(conc)
        return InstanceConfig(**fields)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        log.warning("discovery: pod %s has invalid tokenplane.io/ metadata: %s", name, exc)
        return None


class KubernetesSource:
    def __init__(self, cfg: KubernetesDiscoveryConfig, api_client: Any = None) -> None:
        self.cfg = cfg
        if api_client is None:
            api_client = load_api_client(
                host=cfg.api_host, kubeconfig=cfg.kubeconfig, in_cluster=cfg.in_cluster
            )
        import kubernetes

        self.core = kubernetes.client.CoreV1Api(api_client)
        self.pods: dict[str, dict[str, Any]] = {}
        self.version = ""
        self.lists = 0
        self.watches = 0
        self._resp: Any = None  # the watch response being read (to cut it on stop)

    # -- the calls (worker thread) ---------------------------------------------------------------
    def _list(self) -> tuple[dict[str, dict[str, Any]], str]:
        resp = self.core.list_namespaced_pod(
            self.cfg.namespace, label_selector=self.cfg.label_selector, _preload_content=False
        )
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        pods = {p["metadata"]["name"]: p for p in body.get("items") or ()}
        return pods, str(body["metadata"]["resourceVersion"])

    def _watch(
        self, version: str, events: asyncio.Queue[dict[str, Any] | None], loop: asyncio.AbstractEventLoop
    ) -> None:
        """One watch request; each JSON line to ``events``, then ``None`` however it ended."""
        try:
            resp = self.core.list_namespaced_pod(
                self.cfg.namespace,
                label_selector=self.cfg.label_selector,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=int(self.cfg.watch_timeout_s),
                _preload_content=False,
                _request_timeout=(self.cfg.watch_timeout_s + 10),
            )
            self._resp = resp
            try:
                buf = b""
                for chunk in resp.stream(4096, decode_content=False):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line.strip():
                            _put(loop, events, json.loads(line))
            finally:
                self._resp = None
                resp.release_conn()
        finally:
            _put(loop, events, None)

    # -- the loop ---------------------------------------------------------------------------------
    def _apply(self, sync: PoolSync) -> None:
        wanted = {}
        for pod in self.pods.values():
            inst = instance_of(pod, self.cfg.port_name)
            if inst is not None:
                wanted[inst.id] = inst
        sync.apply(wanted)

    async def run(self, sync: PoolSync) -> None:
        import kubernetes

        delay = self.cfg.backoff_s
        while True:
            try:
                if not self.version:
                    self.pods, self.version = await asyncio.to_thread(self._list)
                    self.lists += 1
                    self._apply(sync)
                await self._follow(sync)
                delay = self.cfg.backoff_s
            except Gone:
                log.info("discovery: resourceVersion %s expired; listing again", self.version)
                self.version = ""
            except kubernetes.client.ApiException as exc:
                if exc.status == 410:
                    self.version = ""
                    continue
                log.warning("discovery: API server answered %s; retrying in %.1f s", exc.status, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.cfg.backoff_max_s)
            except Exception as exc:  # connection refused or reset, timeouts: the API server is away
                log.warning("discovery: watch failed (%s); retrying in %.1f s", type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.cfg.backoff_max_s)

    async def _follow(self, sync: PoolSync) -> None:
        """One watch from ``self.version`` until it ends; raises :class:`Gone` on 410."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        worker = asyncio.create_task(asyncio.to_thread(self._watch, self.version, events, loop))
        self.watches += 1
        try:
            while (event := await events.get()) is not None:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(obj.get("message", ""))
                    raise kubernetes_error(obj)
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.version = str(version)
                if kind == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                if kind == "DELETED":
                    self.pods.pop(name, None)
                else:
                    self.pods[name] = obj
                self._apply(sync)
            await worker  # raises what the thread raised (a reset connection...)
        finally:
            resp = self._resp
            if not worker.done() and resp is not None:
                resp.shutdown()  # unblocks the thread's read: stopping does not wait for timeoutSeconds
                worker.add_done_callback(lambda t: t.cancelled() or t.exception())


def _put(
    loop: asyncio.AbstractEventLoop, q: asyncio.Queue[dict[str, Any] | None], item: dict[str, Any] | None
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed while the watch ran out
        loop.call_soon_threadsafe(q.put_nowait, item)


def kubernetes_error(obj: dict[str, Any]) -> Exception:
    import kubernetes

    err: Exception = kubernetes.client.ApiException(
        status=obj.get("code", 500), reason=obj.get("message", "")
    )
    return err


__all__ = ["KubernetesSource", "instance_of"]
