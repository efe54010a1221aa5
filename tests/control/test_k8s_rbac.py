"""The Role under deploy/kubernetes/ allows every call the Kubernetes actuator and the Kubernetes
instance discovery make, and no more than the gateway needs: each request they sent to the fake API
servers, mapped to its RBAC verb and resource, must be granted by a rule."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tokenplane.control.k8s import KubernetesActuator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from kube_pods import FakePodApi
from manifests import base_resource

NS = "inference"
_PATH = re.compile(
    r"^/apis?/(?:(?P<group>[^/]+)/)?(?P<version>v[^/]+)/namespaces/[^/]+/(?P<res>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
_VERB = {"GET": "get", "PATCH": "patch", "PUT": "update"}


def _rbac_request(method: str, path: str) -> tuple[str, str, str]:
    """(apiGroup, resource[/subresource], verb) as the API server's authorizer sees a request."""
    m = _PATH.match(path.split("?")[0])
    assert m is not None, path
    group = m.group("group") if path.startswith("/apis/") else ""
    resource = m.group("res") + (f"/{m.group('sub')}" if m.group("sub") else "")
    if method == "GET" and m.group("name") is None:  # a collection: list, or watch
        query = path.partition("?")[2].lower()
        return group, resource, "watch" if "watch=true" in query or "watch=1" in query else "list"
    return group, resource, _VERB[method]


def _allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet"])
def test_the_role_grants_every_call_the_actuator_makes(kube_api: Any, kind: str) -> None:
    resource = "deployments" if kind == "Deployment" else "statefulsets"
    kube_api.add(NS, resource, "llm", 1)
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_api.url))

    async def drive() -> None:
        act = KubernetesActuator(NS, "llm", kind, client, min_replicas=1, max_replicas=4)
        await act.start(2)
        kube_api.converge()
        await act.list()
        await act.stop([h.instance_id for h in (await act.list())[-1:]])
        await act.close()

    asyncio.run(drive())
    calls = {_rbac_request(method, path) for method, path, _ in kube_api.requests}
    assert {verb for _, _, verb in calls} >= {"get", "patch"}
    rules = base_resource("Role")["rules"]
    for call in calls:
        assert _allowed(rules, *call), f"the Role does not allow {call}"
    assert not _allowed(rules, "apps", f"{resource}/scale", "delete")
    assert not _allowed(rules, "", "secrets", "get")


def test_the_role_grants_every_call_the_pod_discovery_makes() -> None:
    from tokenplane.gateway.config import KubernetesDiscoveryConfig
    from tokenplane.gateway.discovery.kubernetes import KubernetesSource

    class Sink:
        def apply(self, wanted: Any) -> None:
            self.wanted = wanted

    async def drive() -> set[tuple[str, str, str]]:
        api = FakePodApi()
        await api.start()
        try:
            api.add_pod("vllm-0", 8000, "llama-3-8b", ready=True, ns=NS)
            cfg = KubernetesDiscoveryConfig(
                namespace=NS, label_selector="app=vllm", api_host=api.url, watch_timeout_s=1
            )
            source = KubernetesSource(cfg)
            task = asyncio.create_task(source.run(Sink()))  # type: ignore[arg-type]
            while source.watches < 1:
                await asyncio.sleep(0.01)
            await api.expire()  # 410: a second list
            while source.lists < 2:
                await asyncio.sleep(0.01)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            await api.stop()
        return {_rbac_request(method, path) for method, path in api.requests}

    calls = asyncio.run(drive())
    assert calls == {("", "pods", "list"), ("", "pods", "watch")}
    rules = base_resource("Role")["rules"]
    for call in calls:
        assert _allowed(rules, *call), f"the Role does not allow {call}"
    assert not _allowed(rules, "", "pods", "delete")
