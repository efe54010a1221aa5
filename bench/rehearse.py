"""Twin versus live on the issue's two scenarios and one more, with the done-when figures (issue 19).

    python bench/rehearse.py [--json] [--only default|fault|unseen]

``default``: the embedded default scenario's first run (round-robin) at the rehearsal size
(``--scale 0.25``: 10 copilot users, about 2.5 min live). ``fault``: ``examples/lost-gpu.yaml``'s
``restart`` run at rehearsal size (4 instances, 5 % of the load, arrivals over 60 s, the run and
the loss compressed with them). ``unseen``: the same fault run at another seed (23) and load
(0.07), a check the path's calibration was not built on. Each case's twin runs with the request
path's cost that the live stack's calibration probe measured before the workload (``path``: the
figure, the probe's medians), and ``before`` holds the twin without it (as before the probe
existed) against the same live run. Each prints TTFT p50, throughput and prefix-hit ratio of both
sides and whether they are within the issue's bounds (10 %, 10 %, 5 points), the load average
during the live run and the TTFT mean per hop (instance, gateway, client) that explains the gap.
Takes about 5 minutes; run it on as quiet a machine as you have.

``--client-cost`` instead measures what the client alone adds: one emulator (5 ms fixed steps, no
gateway), 40 sequential streamed requests of 1,000 prompt tokens and one output token through the
openai client (as the rehearsal sends them) and through bare aiohttp, alternately twice; it prints
the median time to the first chunk and the client's CPU ms per request for each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokenplane.rehearse.command import rehearse  # noqa: E402
from tokenplane.sim.scenario import load_scenario, parse_scenario  # noqa: E402

DEFAULT = ROOT / "src" / "tokenplane" / "data" / "default-scenario.yaml"
CASES: dict[str, dict[str, Any]] = {
    "default": {"path": None, "run": None, "scale": 0.25},
    "fault": {
        "path": ROOT / "examples" / "lost-gpu.yaml",
        "run": "restart",
        "scale": 0.05,
        "instances": 4,
        "duration": 60.0,
    },
    "unseen": {
        "path": ROOT / "examples" / "lost-gpu.yaml",
        "run": "restart",
        "scale": 0.07,
        "instances": 4,
        "duration": 60.0,
        "seed": 23,
    },
}


def _within(diff: float | None, bound: float) -> bool | None:
    return None if diff is None else abs(diff) <= bound


def figures(result: dict[str, Any]) -> dict[str, Any]:
    t, li, d = result["twin"], result["live"], result["rel_diff"]
    return {
        "ttft_p50_s": [t["ttft_p50_s"], li["ttft_p50_s"], d["ttft_p50_s"]],
        "throughput_rps": [t["throughput_rps"], li["throughput_rps"], d["throughput_rps"]],
        "prefix_hit_ratio": [t["prefix_hit_ratio"], li["prefix_hit_ratio"], d["prefix_hit_ratio_points"]],
        "ttft_p99_s": [t["ttft_p99_s"], li["ttft_p99_s"], d["ttft_p99_s"]],
        "tbt_p50_s": [t["tbt_p50_s"], li["tbt_p50_s"], d["tbt_p50_s"]],
        "tbt_p99_s": [t["tbt_p99_s"], li["tbt_p99_s"], d["tbt_p99_s"]],
        "requests": [t["requests_total"], li["requests_total"]],
        "completed": [t["requests_completed"], li["requests_completed"]],
        "ttft_mean_s": {"twin": t["ttft_mean_s"], **li["ttft_mean_by_hop_s"], "client": li["ttft_mean_s"]},
        # the path during the workload (means), against the probe's idle medians in ``path``
        "hops_in_run_s": _hops(li),
        "driver_late_mean_s": li["driver_late_mean_s"],
        "load_average": li["load_average"],
        "live_wall_s": li["wall_seconds"],
        "retries": [t.get("retries"), li["retries"]],
        "path": {k: v for k, v in result["path"].items() if k not in ("twin_without", "rel_diff_without")},
        "met": {
            "ttft_p50_within_10pct": _within(d["ttft_p50_s"], 0.10),
            "throughput_within_10pct": _within(d["throughput_rps"], 0.10),
            "prefix_hit_within_5_points": _within(d["prefix_hit_ratio_points"], 5.0),
        },
        "before": _before(result),
    }


def _hops(live: dict[str, Any]) -> dict[str, float | None]:
    by = live["ttft_mean_by_hop_s"]
    inst, gw, client = by.get("instance"), by.get("gateway"), live["ttft_mean_s"]
    return {
        "gateway_hop": None if gw is None or inst is None else gw - inst,
        "client_hop": None if gw is None else client - gw,
    }


def _before(result: dict[str, Any]) -> dict[str, Any]:
    """The twin without the request path (as before the probe) against the same live run."""
    path, li = result["path"], result["live"]
    t, d = path["twin_without"], path["rel_diff_without"]
    return {
        **{k: [t[k], li[k], d[k]] for k in ("ttft_p50_s", "ttft_p99_s", "throughput_rps", "tbt_p50_s")},
        "prefix_hit_ratio": [
            t["prefix_hit_ratio"],
            li["prefix_hit_ratio"],
            path["prefix_hit_ratio_points_without"],
        ],
        "met": {
            "ttft_p50_within_10pct": _within(d["ttft_p50_s"], 0.10),
            "throughput_within_10pct": _within(d["throughput_rps"], 0.10),
            "prefix_hit_within_5_points": _within(path["prefix_hit_ratio_points_without"], 5.0),
        },
    }


async def _client_cost(rounds: int = 2, n: int = 40) -> dict[str, list[list[float]]]:
    import statistics
    import subprocess
    import time

    import aiohttp
    import openai

    from tokenplane.demo import _free_port, _wait_healthy
    from tokenplane.rehearse.prompts import prompt_text
    from tokenplane.sim.workloads.base import RequestSpec

    port = _free_port()
    args = ["--port", str(port), "--served-model-name", "m", "--fixed-step-ms", "5"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenplane.emulator", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    out: dict[str, list[list[float]]] = {"openai": [], "aiohttp": []}
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_healthy(session, url, proc, "emulator")
            client = openai.AsyncOpenAI(
                base_url=url + "/v1", api_key="x", max_retries=0, http_client=openai.DefaultAioHttpClient()
            )
            uid = 0
            for _ in range(rounds):
                for mode in out:
                    firsts = []
                    cpu0 = time.process_time()
                    for _ in range(n):
                        uid += 1
                        prompt = prompt_text(RequestSpec(uid, 0.0, 1000, 1, (), 16))
                        t = time.perf_counter()
                        body = {"model": "m", "prompt": prompt, "max_tokens": 1, "stream": True}
                        if mode == "openai":
                            async with client.completions.with_streaming_response.create(
                                model="m", prompt=prompt, max_tokens=1, stream=True
                            ) as r:
                                async for line in r.iter_lines():
                                    if line.startswith("data: {"):
                                        firsts.append(time.perf_counter() - t)
                                        break
                        else:
                            async with session.post(url + "/v1/completions", json=body) as resp:
                                async for raw in resp.content:
                                    if raw.startswith(b"data: {"):
                                        firsts.append(time.perf_counter() - t)
                                        break
                    cpu = (time.process_time() - cpu0) / n
                    out[mode].append([statistics.median(firsts) * 1000, cpu * 1000])
            await client.close()
    finally:
        proc.terminate()
        proc.wait()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--only", choices=sorted(CASES))
    p.add_argument("--client-cost", action="store_true", help="what the openai client adds (see above)")
    a = p.parse_args()
    if a.client_cost:
        import asyncio

        from tokenplane.runloop import new_event_loop

        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            cost = runner.run(_client_cost())
        print(json.dumps({"first_chunk_ms_and_cpu_ms_per_request": cost, "load_average": os.getloadavg()}))
        return
    out: dict[str, Any] = {}
    for name, case in CASES.items():
        if a.only and name != a.only:
            continue
        path = case["path"]
        sc = parse_scenario(yaml.safe_load(DEFAULT.read_text())) if path is None else load_scenario(path)
        if "seed" in case:
            sc = sc.model_copy(
                update={"runs": [r.model_copy(update={"seed": case["seed"]}) for r in sc.runs]}
            )
        result = rehearse(
            sc,
            run_name=case["run"],
            scale=case["scale"],
            instances=case.get("instances"),
            duration=case.get("duration"),
        )
        out[name] = figures(result)
        if not a.json:
            print(name, json.dumps(out[name], default=str), flush=True)
    if a.json:
        print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
