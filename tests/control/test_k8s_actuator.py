"""The Kubernetes actuator, through the official client, against a fake API server at the HTTP seam."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from tokenplane.control import InstanceState, ScaleApiError
from tokenplane.control.k8s import KubernetesActuator

NS = "inference"


FakeKubeApi = Any  # tests/control/conftest.py


@pytest.fixture
def api(kube_api: FakeKubeApi) -> Iterator[FakeKubeApi]:
    kube_api.add(NS, "deployments", "llm", 1)
    kube_api.add(NS, "statefulsets", "llm-sts", 2)
    yield kube_api


def _client(api: FakeKubeApi) -> kubernetes.client.ApiClient:
    return kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url))


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def test_deployment_scales_up_and_down_through_the_scale_subresource(api: FakeKubeApi) -> None:
    async def body() -> None:
        act = KubernetesActuator(NS, "llm", "Deployment", _client(api), min_replicas=1, max_replicas=5)
        assert not act.tracks_instances
        started = await act.start(2)
        assert [h.instance_id for h in started] == ["llm-1", "llm-2"]
        assert all(h.state is InstanceState.STARTING and h.url is None for h in started)
        assert api.replicas(NS, "deployments", "llm") == 3
        states = [h.state for h in await act.list()]
        assert states == [InstanceState.READY, InstanceState.STARTING, InstanceState.STARTING]
        api.converge()
        assert all(h.state is InstanceState.READY for h in await act.list())
        await act.start(10)  # capped at max_replicas
        assert api.replicas(NS, "deployments", "llm") == 5
        api.converge()
        await act.stop(["llm-4"])
        assert api.replicas(NS, "deployments", "llm") == 4
        stopping = [h for h in await act.list() if h.state is InstanceState.STOPPING]
        assert [h.instance_id for h in stopping] == ["llm-4"]  # status still 5 until pods go
        await act.close()

    asyncio.run(body())
    scale_path = f"/apis/apps/v1/namespaces/{NS}/deployments/llm/scale"
    assert api.requests and all(path == scale_path for _, path, _ in api.requests)
    patches = [(m, ct) for m, _, ct in api.requests if m == "PATCH"]
    assert patches and all(ct == "application/strategic-merge-patch+json" for _, ct in patches)
    assert api.patches == [{"spec": {"replicas": 3}}, {"spec": {"replicas": 5}}, {"spec": {"replicas": 4}}]


def test_never_below_the_configured_minimum(api: FakeKubeApi) -> None:
    async def body() -> None:
        act = KubernetesActuator(NS, "llm", "Deployment", _client(api), min_replicas=1)
        await act.start(2)
        await act.stop(["a", "b", "c", "d"])
        assert api.replicas(NS, "deployments", "llm") == 1
        n = len(api.requests)
        await act.stop(["a"])  # already at the floor: read, no patch
        assert [m for m, _, _ in api.requests[n:]] == ["GET"]
        assert await act.scale_to(0) == 1
        assert api.replicas(NS, "deployments", "llm") == 1

    asyncio.run(body())


def test_statefulset_with_url_pattern_tracks_pods(api: FakeKubeApi) -> None:
    pattern = "http://{name}-{ordinal}.{name}-headless.{namespace}.svc.cluster.local:8000"

    async def body() -> None:
        act = KubernetesActuator(NS, "llm-sts", "StatefulSet", _client(api), url_pattern=pattern)
        assert act.tracks_instances
        new = await act.start(1)
        assert new[0].instance_id == "llm-sts-2"
        assert new[0].url == "http://llm-sts-2.llm-sts-headless.inference.svc.cluster.local:8000"
        handles = await act.list()
        assert [(h.instance_id, h.state) for h in handles] == [
            ("llm-sts-0", InstanceState.READY),
            ("llm-sts-1", InstanceState.READY),
            ("llm-sts-2", InstanceState.STARTING),
        ]

    asyncio.run(body())
    assert api.replicas(NS, "statefulsets", "llm-sts") == 3
    assert {p for _, p, _ in api.requests} == {f"/apis/apps/v1/namespaces/{NS}/statefulsets/llm-sts/scale"}


def test_api_errors_are_retried_with_backoff(api: FakeKubeApi) -> None:
    sleeps = Sleeps()

    async def body() -> None:
        act = KubernetesActuator(
            NS, "llm", "Deployment", _client(api), retries=3, backoff_s=0.25, backoff_max_s=0.6, sleep=sleeps
        )
        api.fail_next = [503, 500, 429]
        await act.start(1)
        assert api.replicas(NS, "deployments", "llm") == 2
        api.fail_next = [503, 503, 503, 503]
        with pytest.raises(ScaleApiError) as err:
            await act.scale_to(4)
        assert err.value.status == 503
        assert api.replicas(NS, "deployments", "llm") == 2

    asyncio.run(body())
    assert sleeps.delays == [0.25, 0.5, 0.6, 0.25, 0.5, 0.6]


def test_client_errors_are_not_retried(api: FakeKubeApi) -> None:
    sleeps = Sleeps()

    async def body() -> None:
        act = KubernetesActuator(NS, "missing", "Deployment", _client(api), sleep=sleeps)
        with pytest.raises(ScaleApiError) as err:
            await act.start(1)
        assert err.value.status == 404

    asyncio.run(body())
    assert sleeps.delays == []
    assert len(api.requests) == 1


def test_fake_server_accepts_json_patch_and_merge_patch(api: FakeKubeApi) -> None:
    apps = kubernetes.client.AppsV1Api(_client(api))
    apps.patch_namespaced_deployment_scale(
        "llm", NS, [{"op": "replace", "path": "/spec/replicas", "value": 4}]
    )
    assert api.replicas(NS, "deployments", "llm") == 4
    assert api.requests[-1][2] == "application/json-patch+json"
    scale = apps.read_namespaced_deployment_scale("llm", NS)
    assert scale.spec.replicas == 4 and scale.kind == "Scale"


def test_url_pattern_needs_a_statefulset(api: FakeKubeApi) -> None:
    from tokenplane.control import ActuatorError

    with pytest.raises(ActuatorError, match="StatefulSet"):
        KubernetesActuator(NS, "llm", "Deployment", _client(api), url_pattern="http://{name}-{ordinal}")
