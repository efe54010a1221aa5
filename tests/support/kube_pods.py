"""A fake Kubernetes API server for pods: list, and watch with the real protocol (chunked JSON
lines of ADDED / MODIFIED / DELETED / BOOKMARK events from a resourceVersion, an ERROR event with
code 410 for a version compacted away), and the server going away and coming back on its port."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
from typing import Any

from aiohttp import web


def _selects(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _gone(message: str) -> dict[str, Any]:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    return {"type": "ERROR", "object": {**status, "reason": "Expired", "code": 410}}


class FakePodApi:
    def __init__(self) -> None:
        self.version = 100
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (version, type, pod)
        self.oldest = 0  # versions below this are compacted: a watch from them gets 410
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        self.changed = asyncio.Event()
        self.watchers: set[web.StreamResponse] = set()
        self.expired = 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._runner: web.AppRunner | None = None

    # -- the pods ---------------------------------------------------------------------------------
    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        self.version += 1
        pod["metadata"]["resourceVersion"] = str(self.version)
        self.history.append((self.version, kind, copy.deepcopy(pod)))
        self.changed.set()
        self.changed = asyncio.Event()

    def add_pod(
        self, name: str, port: int, model: str, *, ready: bool = False, ns: str = "inference", **meta: str
    ) -> None:
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"app": "vllm", "tokenplane.io/model": model},
                "annotations": {"tokenplane.io/gpu": "H100", "tokenplane.io/price-per-hour": "2.5", **meta},
            },
            "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Pending"},
        }
        self.pods[(ns, name)] = pod
        self._event("ADDED", pod)
        if ready:
            self.set_ready(name, True, ns=ns)

    def set_ready(self, name: str, ready: bool, *, ns: str = "inference") -> None:
        pod = self.pods[(ns, name)]
        pod["status"] = {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        self._event("MODIFIED", pod)

    def terminate(self, name: str, *, ns: str = "inference") -> None:
        """kubectl delete: the pod gets a deletionTimestamp (MODIFIED), then goes (DELETED)."""
        pod = self.pods[(ns, name)]
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        self._event("MODIFIED", pod)
        del self.pods[(ns, name)]
        self._event("DELETED", pod)

    def bookmark(self) -> None:
        self.version += 1
        self.history.append(
            (self.version, "BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": str(self.version)}})
        )
        self.changed.set()
        self.changed = asyncio.Event()

    async def expire(self) -> None:
        """Compact the history: open watches get a 410 ERROR event and end; their versions are gone."""
        self.version += 1
        self.oldest = self.version
        self.expired += 1
        self.changed.set()
        self.changed = asyncio.Event()

    # -- the server -------------------------------------------------------------------------------
    async def _pods(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        ns = request.match_info["ns"]
        selector = request.query.get("labelSelector", "")
        if request.query.get("watch") not in ("1", "true", "True"):
            items = [
                p
                for (n, _), p in self.pods.items()
                if n == ns and _selects(selector, p["metadata"]["labels"])
            ]
            body = {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
            return web.json_response(body)
        since = int(request.query.get("resourceVersion") or self.version)
        timeout = float(request.query.get("timeoutSeconds", "30"))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        self.watchers.add(resp)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                if since < self.oldest:
                    await resp.write(
                        (json.dumps(_gone(f"too old resource version: {since}")) + "\n").encode()
                    )
                    break
                changed = self.changed
                for version, kind, pod in self.history:
                    if version > since:
                        since = version
                        if kind == "BOOKMARK" or (
                            pod["metadata"].get("namespace") == ns
                            and _selects(selector, pod["metadata"]["labels"])
                        ):
                            await resp.write((json.dumps({"type": kind, "object": pod}) + "\n").encode())
                left = deadline - loop.time()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
        except ConnectionError:  # the client went away
            return resp
        finally:
            self.watchers.discard(resp)
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def stop(self) -> None:
        """The API server goes away: open watches are cut, new connections refused."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
