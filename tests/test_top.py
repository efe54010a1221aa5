"""``tokenplane top`` against a real gateway (in-process, fake upstreams), and its arithmetic."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tokenplane.top import TopSnapshot, histogram_quantile, parse_metrics, render, snapshot, top

# tests/ has no packages: load the gateway tests' fixtures (fake upstreams, the gateway) by path.
_CONFTEST = Path(__file__).parent / "gateway" / "conftest.py"
_spec = importlib.util.spec_from_file_location("tokenplane_test_gateway_fixtures", _CONFTEST)
assert _spec is not None and _spec.loader is not None
_fixtures = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
if not hasattr(_fixtures, "gateway"):
    _spec.loader.exec_module(_fixtures)
anyio_backend = _fixtures.anyio_backend
names = _fixtures.names
upstreams = _fixtures.upstreams
gateway = _fixtures.gateway
wait = _fixtures.wait


def _text(renderable: object, width: int = 200) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


async def _traffic(gw, model: str, n: int) -> None:
    client = gw.client()
    for i in range(n):
        if i % 2:
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"hi {i}"}], stream=True
            )
            async for _ in stream:
                pass
        else:
            await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=8
            )


@pytest.mark.anyio
async def test_snapshot_and_render_show_instances_and_rates(upstreams, gateway, names, wait) -> None:
    ups = await upstreams(2)
    ups[0].metrics.kv_usage = 0.42
    ups[0].metrics.running = 3
    ups[1].metrics.waiting = 5
    ups[1].metrics.prefix_queries, ups[1].metrics.prefix_hits = 100, 25
    gw = await gateway(ups)

    async def scraped() -> bool:
        inst = await gw.instances()
        return inst["up-0"]["kv_usage"] > 0 and inst["up-1"]["waiting"] == 5

    await wait(scraped)
    await _traffic(gw, names.MODEL, 2)
    first = await snapshot(gw.url)
    assert first.reachable and not first.errors
    assert {i["instance_id"] for i in first.instances} == {"up-0", "up-1"}
    await asyncio.sleep(0.05)
    await _traffic(gw, names.MODEL, 6)
    status, _, _ = await gw.post("/v1/chat/completions", {"model": "nope", "messages": []})
    assert status >= 400
    second = await snapshot(gw.url)

    text = _text(render(second, first))
    for u in ups:
        assert u.name in text
    assert names.MODEL in text
    assert "42.0%" in text  # KV usage of up-0
    assert "25.0%" in text  # cumulative prefix hit rate of up-1 (no change between the two polls)

    # The header's request rate is non-zero: 7 requests between the polls.
    line = next(ln for ln in text.splitlines() if "requests " in ln and "/s" in ln)
    rate = float(line.split("requests ")[1].split("/s")[0])
    assert rate > 0
    # Outcomes and route reasons over the interval.
    assert "ok" in text and "invalid_type" in text
    assert any(reason in text for reason in ("prefix_match", "prefix_miss_least_loaded", "load_imbalance"))
    # TTFT percentiles come from the histogram deltas: the streams saw a first token.
    model_row = next(ln for ln in text.splitlines() if f"│ {names.MODEL} " in ln)
    cells = [c.strip() for c in model_row.split("│")]
    assert cells[4].endswith(("ms", " s")), model_row  # TTFT p50

    # How old each instance's view is: scraped every 0.05 s, so well under the stale mark.
    assert "view age" in text and "stale" not in text

    # The first frame alone (no previous) shows cumulative counts rather than rates.
    alone = _text(render(first))
    assert "since start" in alone and "up-0" in alone


@pytest.mark.anyio
async def test_top_once_prints_one_frame(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    gw = await gateway(ups)
    await _traffic(gw, names.MODEL, 2)
    console = Console(record=True, width=200, color_system=None)
    # top() runs its own event loop: run it in a thread so this test's loop keeps serving the gateway.
    await asyncio.to_thread(top, gw.url, 0.1, True, console=console)
    text = console.export_text()
    assert "tokenplane top" in text and "up-0" in text and gw.url in text


def test_top_once_unreachable_exits_1() -> None:
    console = Console(record=True, width=200, color_system=None)
    with pytest.raises(SystemExit) as exc:
        top("http://127.0.0.1:9", 0.05, True, console=console)
    assert exc.value.code == 1
    text = console.export_text()
    assert "UNREACHABLE" in text and "error:" in text


def _snap(text: str, at: float, instances: list[dict] | None = None) -> TopSnapshot:
    return TopSnapshot(
        gateway_url="http://gw",
        taken_at=at,
        wall_time=0.0,
        instances=instances or [],
        families=parse_metrics(text),
        instances_ok=instances is not None,
        metrics_ok=True,
    )


_BASE = """\
# TYPE tokenplane_requests_total counter
tokenplane_requests_total{{model="m",tenant="t",outcome="ok",reason="prefix_match"}} {ok}
tokenplane_requests_total{{model="m",tenant="t",outcome="upstream_error",reason="none"}} {bad}
# TYPE tokenplane_ttft_seconds histogram
tokenplane_ttft_seconds_bucket{{model="m",le="0.1"}} {b1}
tokenplane_ttft_seconds_bucket{{model="m",le="1.0"}} {b2}
tokenplane_ttft_seconds_bucket{{model="m",le="+Inf"}} {b2}
tokenplane_ttft_seconds_count{{model="m"}} {b2}
tokenplane_ttft_seconds_sum{{model="m"}} 1.0
"""


def test_rates_and_quantiles_from_deltas() -> None:
    a = _snap(_BASE.format(ok=10, bad=0, b1=10, b2=10), 100.0)
    b = _snap(_BASE.format(ok=30, bad=10, b1=10, b2=30), 110.0)
    text = _text(render(b, a))
    assert "requests 3.00/s" in text  # (20 ok + 10 errors) / 10 s
    assert "errors 1.00/s (33.3%)" in text
    # Delta buckets: 0 under 0.1 s, 20 in (0.1, 1.0]: p50 = 0.1 + 0.9 * 10/20 = 0.55 s.
    assert "550 ms" in text
    # A counter that went down (restart) counts from zero rather than negative.
    c = _snap(_BASE.format(ok=1, bad=0, b1=1, b2=1), 120.0)
    assert "requests 0.10/s" in _text(render(c, b))


def test_histogram_quantile() -> None:
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None
    assert histogram_quantile(0.5, [(1.0, 10.0), (2.0, 20.0), (math.inf, 20.0)]) == pytest.approx(1.0)
    assert histogram_quantile(0.75, [(1.0, 10.0), (2.0, 20.0), (math.inf, 20.0)]) == pytest.approx(1.5)
    # Rank in the +Inf bucket: the largest finite bound.
    assert histogram_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == pytest.approx(1.0)


def test_later_families_and_fields_show_up() -> None:
    extra = """\
# TYPE tokenplane_queue_depth gauge
tokenplane_queue_depth{model="m"} 7
# TYPE tokenplane_autoscaler_decisions_total counter
tokenplane_autoscaler_decisions_total{action="scale_up",reason="queue_wait"} 2
# TYPE tokenplane_breaker_state gauge
tokenplane_breaker_state{instance="i-1",state="open"} 1
tokenplane_breaker_state{instance="i-1",state="closed"} 0
# TYPE tokenplane_slo_attainment gauge
tokenplane_slo_attainment{model="m",slo="ttft"} 0.97
# TYPE tokenplane_queue_wait_seconds histogram
tokenplane_queue_wait_seconds_bucket{model="m",le="0.5"} 4
tokenplane_queue_wait_seconds_bucket{model="m",le="+Inf"} 4
tokenplane_queue_wait_seconds_count{model="m"} 4
tokenplane_queue_wait_seconds_sum{model="m"} 1.0
"""
    inst = [{"instance_id": "i-1", "model": "m", "ready": True, "healthy": False, "pool": "warm"}]
    text = _text(render(_snap(extra, 1.0, inst)))
    for needle in (
        "tokenplane_queue_depth",
        "tokenplane_autoscaler_decisions_total",
        "action=scale_up",
        "SLO attainment",
        "0.97",
        "open",
        "warm",
        "tokenplane_queue_wait_seconds",
        "mean 0.25",
    ):
        assert needle in text, needle


def test_instances_rebuilt_from_metrics_when_the_listing_is_missing() -> None:
    text = """\
# TYPE tokenplane_instance_kv_usage gauge
tokenplane_instance_kv_usage{instance="a",model="m"} 0.5
# TYPE tokenplane_instance_healthy gauge
tokenplane_instance_healthy{instance="a",model="m"} 1
"""
    snap = _snap(text, 1.0)
    snap.errors.append("/v1/instances: HTTP 404")
    out = _text(render(snap))
    assert "a" in out and "50.0%" in out and "HTTP 404" in out and "1/1 healthy" in out
    assert "view age" not in out  # a gateway that does not export the scrape time: no column


def test_a_view_that_stopped_moving_is_marked_stale() -> None:
    """A runtime too busy to answer its scrapes keeps its last readings: top says how old they are."""
    text = """# TYPE tokenplane_instance_kv_usage gauge
tokenplane_instance_kv_usage{instance="busy",model="m"} 0.0
tokenplane_instance_kv_usage{instance="calm",model="m"} 0.3
# TYPE tokenplane_instance_scrape_timestamp_seconds gauge
tokenplane_instance_scrape_timestamp_seconds{instance="busy",model="m"} 1000.0
tokenplane_instance_scrape_timestamp_seconds{instance="calm",model="m"} 1063.6
"""
    snap = _snap(text, 1.0)
    snap.wall_time = 1064.0
    rows = {ln.split("│")[2].strip(): ln for ln in _text(render(snap)).splitlines() if ln.count("│") > 5}
    assert "64.0s stale" in rows["busy"], rows
    assert "0.4s" in rows["calm"] and "stale" not in rows["calm"], rows
