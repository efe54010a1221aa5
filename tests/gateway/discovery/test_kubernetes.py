"""Kubernetes discovery against a fake API server speaking the watch protocol: ready pods join,
unready and terminating pods drain and leave, a watch that expires (410) re-lists, and the API
server going away and coming back is survived; under steady streaming load no request fails."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.anyio


def _port(url: str) -> int:
    port = urlparse(url).port
    assert port is not None
    return port


def discovery(api_url: str) -> dict[str, Any]:
    return {
        "kind": "kubernetes",
        "drain_timeout_s": 30,
        "kubernetes": {
            "namespace": "inference",
            "label_selector": "app=vllm",
            "api_host": api_url,
            "in_cluster": False,
            "watch_timeout_s": 2,
            "backoff_s": 0.05,
            "backoff_max_s": 0.2,
        },
    }


class Load:
    """Streams one after another on ``width`` lanes; every failure is kept."""

    def __init__(self, gw: Any, model: str, width: int = 4) -> None:
        self.client = gw.client()
        self.model = model
        self.errors: list[BaseException] = []
        self.done = 0
        self.running = True
        self.tasks = [asyncio.create_task(self._lane(i)) for i in range(width)]

    async def _lane(self, lane: int) -> None:
        n = 0
        while self.running:
            n += 1
            try:
                stream = await self.client.chat.completions.create(
                    model=self.model, messages=[{"role": "user", "content": f"lane {lane} #{n}"}], stream=True
                )
                parts = [
                    c.choices[0].delta.content
                    async for c in stream
                    if c.choices and c.choices[0].delta.content
                ]
                assert len(parts) == 10, parts
                self.done += 1
            except Exception as exc:
                self.errors.append(exc)

    async def stop(self) -> None:
        self.running = False
        await asyncio.gather(*self.tasks)


async def test_pods_join_and_leave_through_watch_expiry_and_an_api_restart(
    pod_api: Any, upstreams: Any, gateway: Any, names: Any, wait: Any
) -> None:
    ups = await upstreams(3)
    for u in ups:
        u.tokens, u.token_delay_s = 10, 0.02
    pod_api.add_pod("vllm-a", _port(ups[0].url), names.MODEL, ready=True)
    pod_api.add_pod("elsewhere", _port(ups[2].url), names.MODEL, ready=True, ns="other")
    gw = await gateway([], discovery=discovery(pod_api.url))

    async def serving() -> dict[str, dict[str, Any]]:
        return {k: v for k, v in (await gw.instances()).items()}

    async def usable(*ids: str) -> bool:
        inst = await serving()
        return set(inst) == set(ids) and all(inst[i]["healthy"] for i in ids)

    await wait(lambda: usable("vllm-a"))
    a = (await serving())["vllm-a"]
    assert a["url"] == ups[0].url and a["gpu"] == "H100"
    load = Load(gw, names.MODEL)
    try:
        # a pod that is not ready yet is not served; once ready it joins and takes traffic
        pod_api.add_pod("vllm-b", _port(ups[1].url), names.MODEL)
        await asyncio.sleep(0.3)
        assert set(await serving()) == {"vllm-a"}
        pod_api.set_ready("vllm-b", True)
        await wait(lambda: usable("vllm-a", "vllm-b"))
        seen_b = len(ups[1].requests)
        await wait(lambda: _true(len(ups[1].requests) > seen_b))

        # deleted mid-stream: it drains (its streams finish) and leaves
        while ups[0].events_written == 0:
            await asyncio.sleep(0.01)
        pod_api.terminate("vllm-a")
        await wait(lambda: usable("vllm-b"))
        assert ups[0].disconnects == 0, "a stream on the deleted pod was cut"

        # the watch expires (410 Gone): the source lists again and sees what changed since
        lists = sum(1 for _, p in pod_api.requests if "watch" not in p)
        await pod_api.expire()
        pod_api.add_pod("vllm-c", _port(ups[2].url), names.MODEL, ready=True)
        await wait(lambda: usable("vllm-b", "vllm-c"))
        assert sum(1 for _, p in pod_api.requests if "watch" not in p) > lists
        watched = [p for _, p in pod_api.requests if "watch" in p]
        assert all("resourceVersion=" in p for p in watched)

        # the API server goes away and comes back; a change made meanwhile arrives
        await pod_api.stop()
        await asyncio.sleep(0.5)
        pod_api.set_ready("vllm-c", False)
        assert set(await serving()) == {"vllm-b", "vllm-c"}, "instances stay while the API is away"
        await pod_api.start()
        await wait(lambda: usable("vllm-b"), timeout_s=10)
        done = load.done
        await wait(lambda: _true(load.done > done + 8))
    finally:
        await load.stop()
    assert load.errors == []
    assert load.done > 20


async def _true(value: bool) -> bool:
    return value


async def test_a_watch_resumes_from_its_version_and_lists_again_only_on_410(pod_api: Any) -> None:
    from tokenplane.gateway.config import KubernetesDiscoveryConfig
    from tokenplane.gateway.discovery.kubernetes import KubernetesSource

    class Sink:
        def __init__(self) -> None:
            self.wanted: dict[str, Any] = {}

        def apply(self, wanted: dict[str, Any]) -> None:
            self.wanted = dict(wanted)

    sink = Sink()
    pod_api.add_pod("vllm-0", 8000, "llama-3-8b", ready=True)
    cfg = KubernetesDiscoveryConfig(
        namespace="inference", label_selector="app=vllm", api_host=pod_api.url, watch_timeout_s=1
    )
    source = KubernetesSource(cfg)
    task = asyncio.create_task(source.run(sink))  # type: ignore[arg-type]
    try:
        while source.watches < 2:  # the first watch ran out its timeoutSeconds
            await asyncio.sleep(0.02)
        assert source.lists == 1, "a watch that ends resumes from its version, without a list"
        pod_api.bookmark()
        while source.version != str(pod_api.version):
            await asyncio.sleep(0.02)
        pod_api.add_pod("vllm-1", 8001, "llama-3-8b", ready=True)
        while set(sink.wanted) != {"vllm-0", "vllm-1"}:
            await asyncio.sleep(0.02)
        await pod_api.expire()
        while source.lists < 2:
            await asyncio.sleep(0.02)
        assert set(sink.wanted) == {"vllm-0", "vllm-1"}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
