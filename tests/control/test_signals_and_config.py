"""Signal sources (in-process stats, the HTTP reader of a running gateway) and the config section."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tokenplane.control import (
    AutoscalingConfigError,
    CommandActuator,
    EmulatedFleetActuator,
    GatewaySignalSource,
    PoolStats,
    build_actuator,
    parse_autoscaling_config,
)
from tokenplane.control.k8s import KubernetesActuator
from tokenplane.control.signals import CumulativeBuckets
from tokenplane.gateway.app import create_app
from tokenplane.gateway.config import parse_config


def test_cumulative_buckets_interpolate_complete_buckets() -> None:
    b = CumulativeBuckets(bucket_s=10.0, history_buckets=5)
    b.add(5.0, 0.0)
    b.add(25.0, 200.0)  # 10 req/s throughout
    b.add(35.0, 500.0)  # 30 req/s
    assert b.buckets() == ((10.0, 10.0), (20.0, 20.0))  # [20, 30): half at 10, half at 30
    b.add(36.0, 1.0)  # counter reset: start over
    assert b.buckets() == ()


def test_pool_stats_prompt_tokens_per_s_over_the_last_minute_of_complete_buckets() -> None:
    s = PoolStats(bucket_s=10.0, history_buckets=60)
    assert s.prompt_tokens_per_s(5.0) is None
    s.arrival(5.0)  # a request that did not say its size
    assert s.prompt_tokens_per_s(15.0) is None
    for t in range(0, 100):  # 100 tokens every second from 0 to 99 s
        s.arrival(float(t), 100)
    assert s.prompt_tokens_per_s(15.0) == pytest.approx(100.0)  # bucket [0, 10) only
    assert s.prompt_tokens_per_s(95.0) == pytest.approx(100.0)  # [30, 90)
    s.arrival(100.0, 60_000)  # a burst in [100, 110)
    assert s.prompt_tokens_per_s(109.0) == pytest.approx(100.0)  # the burst's bucket is not complete
    assert s.prompt_tokens_per_s(110.0) == pytest.approx((5 * 1000 + 60_000) / 60)


def test_pool_stats_buckets_and_attainment() -> None:
    s = PoolStats(bucket_s=1.0, history_buckets=10, slo_window_s=10.0, ttft_slo_s=0.5)
    for k in range(30):
        s.arrival(k * 0.1)  # 10 per second for 3 s
    for t in (0.1, 0.2, 0.3, 0.9):
        s.first_token(1.0, t)
    s.finished(2.0, output_tokens=10)
    s.finished(3.0, ok=False)
    assert s.arrivals(3.5) == ((0.0, 10.0), (1.0, 10.0), (2.0, 10.0))
    w = s.window(4.0)
    assert w["ttft_attainment"] == 0.75
    assert w["ttft_p90_s"] == 0.9
    assert w["throughput_rps"] == pytest.approx(1 / 4.0)


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def test_gateway_signal_source_reads_instances_and_metrics() -> None:
    reg = CollectorRegistry()
    requests = Counter("tokenplane_requests", "", ["model", "tenant", "outcome", "reason"], registry=reg)
    depth = Gauge("tokenplane_queue_depth", "", ["model"], registry=reg)
    inflight = Gauge("tokenplane_admitted_in_flight", "", ["model"], registry=reg)
    ttft = Histogram("tokenplane_ttft_seconds", "", ["model"], buckets=(0.1, 0.5, 1.0, 5.0), registry=reg)
    prompt = Counter("tokenplane_prompt_tokens", "", ["model"], registry=reg)
    instances: list[dict[str, Any]] = [
        {
            "instance_id": "a",
            "model": "m",
            "url": "http://a",
            "running": 3,
            "waiting": 1,
            "kv_usage": 0.5,
            "outstanding_requests": 4,
            "labels": {"zone": "x"},
            "breaker": "closed",
            "scraped_at": None,
        },
        {"instance_id": "b", "model": "other", "url": "http://b"},
    ]

    async def listing(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": instances})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(reg), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/v1/instances", listing)
    app.router.add_get("/metrics", metrics)

    async def body() -> None:
        runner, url = await _serve(app)
        src = GatewaySignalSource(url, "m", bucket_s=10.0, slo_window_s=60.0, ttft_slo_s=0.5)
        try:
            first = await src.sample(0.0)
            assert [v.instance_id for v in first.instances] == ["a"]
            assert first.instances[0].running == 3 and first.instances[0].outstanding_requests == 4
            assert first.arrivals == () and first.ttft_attainment is None
            assert first.prompt_tokens_per_s is None
            # 200 requests end OK in 20 s, 5 are queued and 5 in flight at the end: 210 arrivals.
            requests.labels("m", "t", "ok", "prefix_match").inc(200)
            requests.labels("other", "t", "ok", "x").inc(999)
            prompt.labels("m").inc(20 * 500)
            prompt.labels("other").inc(7)
            depth.labels("m").set(5)
            inflight.labels("m").set(5)
            for v in [0.05] * 90 + [0.7] * 10:
                ttft.labels("m").observe(v)
            second = await src.sample(20.0)
            assert second.queued == 5
            assert second.arrivals == ((0.0, 10.5), (10.0, 10.5))
            assert second.throughput_rps == pytest.approx(10.0)
            assert second.ttft_attainment == pytest.approx(0.9)
            assert second.ttft_p90_s == 0.1
            assert second.prompt_tokens_per_s == pytest.approx(500.0)
        finally:
            await src.close()
            await runner.cleanup()

    asyncio.run(body())


def test_gateway_signal_source_parses_the_real_gateway() -> None:
    cfg = parse_config(
        {
            "models": [{"name": "m"}],
            "instances": [{"id": "a", "url": "http://127.0.0.1:9", "model": "m", "kind": "emulated"}],
            "health": {"interval_s": 60},
            "scrape": {"enabled": False},
        }
    )

    async def body() -> None:
        runner, url = await _serve(create_app(cfg))
        src = GatewaySignalSource(url, "m", ttft_slo_s=1.0)
        try:
            s = await src.sample(1.0)
            assert [v.instance_id for v in s.instances] == ["a"]
            assert s.queued == 0
        finally:
            await src.close()
            await runner.cleanup()

    asyncio.run(body())


BASE = {
    "enabled": True,
    "interval_s": 5,
    "model": "m",
    "pool": {"min_instances": 1, "max_instances": 4, "capacity_rps": 3, "cold_start_s": 60},
}


def test_config_builds_each_actuator(kube_api: Any) -> None:
    emu = parse_autoscaling_config(
        {**BASE, "actuator": {"kind": "emulated", "args": ["--speed", "20"], "port_range": [19000, 19010]}}
    )
    act = build_actuator(emu)
    assert isinstance(act, EmulatedFleetActuator) and act.port_range == (19000, 19010)
    assert emu.build_scaler().params.decision_interval_s == 5  # type: ignore[attr-defined]
    assert emu.pool_spec().max_instances == 4

    cmd = parse_autoscaling_config(
        {**BASE, "actuator": {"kind": "command", "scale_cmd": [sys.executable, "-c", "pass", "{replicas}"]}}
    )
    c = build_actuator(cmd)
    assert isinstance(c, CommandActuator) and c.min_replicas == 1 and c.max_replicas == 4

    kube_api.add("ns", "statefulsets", "llm", 1)
    k8s = parse_autoscaling_config(
        {
            **BASE,
            "actuator": {
                "kind": "kubernetes",
                "namespace": "ns",
                "name": "llm",
                "workload": "StatefulSet",
                "host": kube_api.url,
                "url_pattern": "http://{name}-{ordinal}.{name}.{namespace}:8000",
            },
        }
    )
    k = build_actuator(k8s)
    assert isinstance(k, KubernetesActuator) and k.min_replicas == 1 and k.tracks_instances
    assert asyncio.run(k.list())[0].url == "http://llm-0.llm.ns:8000"


@pytest.mark.parametrize(
    ("patch", "expect"),
    [
        ({"actuator": {"kind": "nomad"}}, "autoscaling.actuator"),
        ({"actuator": {"kind": "command", "scale_cmd": ["kubectl", "scale"]}}, "{replicas}"),
        ({"actuator": {"kind": "emulated", "args": ["--port", "1"]}}, "port_range"),
        (
            {"actuator": {"kind": "emulated", "port_range": [10, 5]}},
            "autoscaling.actuator.emulated.port_range",
        ),
        (
            {"actuator": {"kind": "kubernetes", "name": "x", "url_pattern": "http://{name}-{ordinal}"}},
            "StatefulSet",
        ),
        ({"pool": {"max_instances": 2}, "actuator": {"kind": "emulated"}}, "capacity_rps"),
        ({"pool": {**BASE["pool"], "min_instances": 9}, "actuator": {"kind": "emulated"}}, "max_instances"),
        (
            {
                "scaler": {"name": "tokenplane", "params": {"target_utilisation": 3}},
                "actuator": {"kind": "emulated"},
            },
            "target_utilisation",
        ),
        ({"scaler": {"name": "nope"}, "actuator": {"kind": "emulated"}}, "nope"),
        ({"interval_s": 0, "actuator": {"kind": "emulated"}}, "autoscaling.interval_s"),
        ({"surprise": 1, "actuator": {"kind": "emulated"}}, "autoscaling.surprise"),
    ],
)
def test_config_errors_name_the_field(patch: dict[str, Any], expect: str) -> None:
    with pytest.raises(AutoscalingConfigError) as err:
        parse_autoscaling_config({**BASE, **patch}, source="gw.yaml")
    assert expect in str(err.value) and "gw.yaml" in str(err.value)
