"""A fake Kubernetes API server at the HTTP seam: the apps/v1 ``scale`` subresource only.

``GET``/``PATCH /apis/apps/v1/namespaces/{ns}/{deployments|statefulsets}/{name}/scale`` with the
real API's JSON (``autoscaling/v1`` ``Scale``); PATCH accepts merge patch, strategic merge patch
and JSON patch bodies, as the official client sends them. ``status.replicas`` follows
``spec.replicas`` only when :meth:`FakeKubeApi.converge` is called (pods take time to come up).
``fail_next`` holds statuses to answer (with a ``Status`` body) before serving normally.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

_PATH = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/(deployments|statefulsets)/([^/]+)/scale$")
PATCH_TYPES = (
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
)


class FakeKubeApi:
    def __init__(self) -> None:
        self.workloads: dict[tuple[str, str, str], dict[str, int]] = {}
        self.requests: list[tuple[str, str, str]] = []  # (method, path, content type)
        self.patches: list[Any] = []
        self.fail_next: list[int] = []
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": message,
                        "reason": reason,
                        "code": code,
                    },
                )

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                ctype = self.headers.get("Content-Type", "")
                with api.lock:
                    api.requests.append((method, self.path, ctype))
                    if api.fail_next:
                        code = api.fail_next.pop(0)
                        return self._status(code, "InternalError", f"injected {code}")
                    m = _PATH.match(self.path.split("?")[0])
                    if m is None:
                        return self._status(404, "NotFound", f"no route {self.path}")
                    key = (m.group(1), m.group(2), m.group(3))
                    w = api.workloads.get(key)
                    if w is None:
                        return self._status(404, "NotFound", f"{m.group(2)} {m.group(3)!r} not found")
                    if method == "PATCH":
                        if ctype not in PATCH_TYPES:
                            return self._status(415, "UnsupportedMediaType", f"unsupported {ctype}")
                        body = json.loads(raw)
                        api.patches.append(body)
                        replicas = _replicas_from_patch(body, ctype)
                        if not isinstance(replicas, int) or replicas < 0:
                            return self._status(422, "Invalid", "spec.replicas must be a non-negative int")
                        w["spec"] = replicas
                    return self._send(200, _scale(key, w))

            def do_GET(self) -> None:
                self._handle("GET")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, namespace: str, resource: str, name: str, replicas: int) -> None:
        self.workloads[(namespace, resource, name)] = {"spec": replicas, "status": replicas}

    def replicas(self, namespace: str, resource: str, name: str) -> int:
        return self.workloads[(namespace, resource, name)]["spec"]

    def converge(self) -> None:
        with self.lock:
            for w in self.workloads.values():
                w["status"] = w["spec"]

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _replicas_from_patch(body: Any, ctype: str) -> Any:
    if ctype == "application/json-patch+json":
        for op in body:
            if op.get("op") in ("replace", "add") and op.get("path") == "/spec/replicas":
                return op.get("value")
        return None
    return (body.get("spec") or {}).get("replicas")


def _scale(key: tuple[str, str, str], w: dict[str, int]) -> dict[str, Any]:
    ns, _, name = key
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"},
        "spec": {"replicas": w["spec"]},
        "status": {"replicas": w["status"], "selector": f"app={name}"},
    }


@pytest.fixture
def kube_api() -> Iterator[FakeKubeApi]:
    with FakeKubeApi() as fake:
        yield fake
