"""Which Kubernetes client the pod discovery uses: the official synchronous ``kubernetes`` (its watch
read in a worker thread, as gateway/discovery/kubernetes.py does) against ``kubernetes_asyncio``
(read on the event loop), side by side in one run against the fake API server of the tests
(tests/support/kube_pods.py) in its own process: one list of PODS pods, then one watch replaying
EVENTS events from the start; rounds alternate. Reported: the client process's CPU seconds and wall
seconds per round, and the ratios. ``kubernetes_asyncio`` is not a dependency: install it aside
(``pip install --target /tmp/ka --no-deps kubernetes-asyncio``) and put it on PYTHONPATH.

    PYTHONPATH=/tmp/ka nice -n 10 .venv/bin/python bench/discovery_clients.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

NS = "inference"


async def _serve(port: int, pods: int, events: int) -> None:
    from kube_pods import FakePodApi

    api = FakePodApi()
    api.port, api.url = port, f"http://127.0.0.1:{port}"
    for i in range(pods):
        api.add_pod(f"vllm-{i}", 8000, "llama-3-8b", ready=True, ns=NS)
    for i in range(events):
        api.set_ready(f"vllm-{i % pods}", i % 2 == 0, ns=NS)
    await api.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


def _sync_round(url: str, events: int) -> None:
    import kubernetes

    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url)))

    def run() -> int:
        resp = core.list_namespaced_pod(NS, label_selector="app=vllm", _preload_content=False)
        json.loads(resp.data)
        resp = core.list_namespaced_pod(
            NS,
            label_selector="app=vllm",
            watch=True,
            resource_version="1",
            timeout_seconds=30,
            _preload_content=False,
        )
        n, buf = 0, b""
        for chunk in resp.stream(4096, decode_content=False):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                json.loads(line)
                n += 1
            if n >= events:
                break
        resp.release_conn()
        return n

    asyncio.run(_in_thread(run))


async def _in_thread(fn: object) -> None:
    await asyncio.to_thread(fn)  # type: ignore[arg-type]


def _async_round(url: str, events: int) -> None:
    import kubernetes_asyncio as ka

    async def run() -> int:
        cfg = ka.client.Configuration(host=url)
        async with ka.client.ApiClient(cfg) as api:
            core = ka.client.CoreV1Api(api)
            resp = await core.list_namespaced_pod(NS, label_selector="app=vllm", _preload_content=False)
            json.loads(await resp.read())
            resp = await core.list_namespaced_pod(
                NS,
                label_selector="app=vllm",
                watch=True,
                resource_version="1",
                timeout_seconds=30,
                _preload_content=False,
            )
            n = 0
            while n < events:
                line = await resp.content.readline()
                if not line:
                    break
                json.loads(line)
                n += 1
            resp.close()
            return n

    asyncio.run(run())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--serve", type=int)
    p.add_argument("--pods", type=int, default=500)
    p.add_argument("--events", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    if a.serve:
        asyncio.run(_serve(a.serve, a.pods, a.events))
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "--serve", str(port), "--pods", str(a.pods), "--events", str(a.events)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        total = a.pods + a.events  # the watch from the start replays every ADDED and MODIFIED
        results: dict[str, list[tuple[float, float]]] = {"kubernetes (thread)": [], "kubernetes_asyncio": []}
        for _ in range(a.rounds):
            for name, fn in (("kubernetes (thread)", _sync_round), ("kubernetes_asyncio", _async_round)):
                c0, w0 = time.process_time(), time.perf_counter()
                fn(url, total)
                results[name].append((time.process_time() - c0, time.perf_counter() - w0))
        med = {
            k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
            for k, v in results.items()
        }
        for k, (c, w) in med.items():
            print(
                f"{k:22s} cpu {c * 1000:8.1f} ms  wall {w * 1000:8.1f} ms"
                f"  (median of {a.rounds}; {total} events)"
            )
        (sc, sw), (ac, aw) = med["kubernetes (thread)"], med["kubernetes_asyncio"]
        print(f"ratio kubernetes_asyncio / kubernetes: cpu {ac / sc:.2f}  wall {aw / sw:.2f}")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
