"""The live fleet as the twin's run describes it, and what its processes' metrics say.

:func:`emulator_args` configures each emulator as the twin's engine (batch limits, KV capacity,
context length, prefix caching); :func:`gateway_settings` maps the run's ``controls`` onto the
gateway's config; :func:`metric_sums` and :func:`histogram_mean` read the Prometheus ``/metrics``
of the emulators and the gateway after the run.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from tokenplane.sim.catalog import Catalog
from tokenplane.sim.runner import engine_config
from tokenplane.sim.scenario import RunSettings


def emulator_args(run: RunSettings, catalog: Catalog) -> list[str]:
    """The emulator options that make each instance the twin's engine for this run."""
    cfg = engine_config(run.fleet, catalog)
    args = [
        "--tp",
        str(run.fleet.tp),
        "--max-num-seqs",
        str(cfg.max_num_seqs),
        "--max-num-batched-tokens",
        str(cfg.max_num_batched_tokens),
        "--kv-capacity-tokens",
        str(cfg.kv_capacity_tokens),
        "--max-model-len",
        str(cfg.max_model_len or cfg.kv_capacity_tokens),
        "--max-tokens-cap",
        str(cfg.kv_capacity_tokens),
    ]
    if not cfg.enable_prefix_caching:
        args.append("--no-prefix-caching")
    return args


def gateway_settings(run: RunSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """(gateway config sections, tenant options) for the run's controls.

    The gateway always runs its control plane; what the twin's ``controls`` switch maps as: no
    controls or no ``continuation``/``retry_elsewhere`` -> the gateway makes one attempt per
    request (the client's own retries are the driver's); ``continuation`` -> the tenant's
    streams are continued elsewhere; ``retry_budget.ratio`` -> the gateway's budget ratio.
    """
    c = run.controls
    retry: dict[str, Any] = {"max_attempts": 1}
    if c is not None and (c.continuation or c.retry_elsewhere):
        retry = {"max_attempts": 3}
        if c.retry_budget is not None and "ratio" in c.retry_budget:
            retry["budget_ratio"] = float(c.retry_budget["ratio"])
    sections: dict[str, Any] = {
        "retry": retry,
        "limits": {"max_body_bytes": 16 << 20, "max_tokens": 1 << 20, "max_prompt_tokens": 1 << 22},
    }
    tenant = {"continuation": bool(c is not None and c.continuation)}
    return sections, tenant


async def metric_sums(session: aiohttp.ClientSession, urls: list[str], names: set[str]) -> dict[str, float]:
    """Each sample name in ``names`` summed over its labels and the ``/metrics`` of ``urls``;
    unreachable ones (a lost instance) are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(names, 0.0)
    for url in urls:
        try:
            async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError):
            continue
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.name in out:
                    out[smp.name] += smp.value
    return out


async def histogram_totals(session: aiohttp.ClientSession, urls: list[str], name: str) -> tuple[float, float]:
    """(sum, count) of histogram ``name`` over ``urls``."""
    got = await metric_sums(session, urls, {name + "_sum", name + "_count"})
    return got[name + "_sum"], got[name + "_count"]


async def histogram_mean(
    session: aiohttp.ClientSession, urls: list[str], name: str, since: tuple[float, float] = (0.0, 0.0)
) -> float | None:
    """Mean of histogram ``name`` over ``urls``, of the observations after ``since`` (a
    :func:`histogram_totals` taken earlier: the calibration probe's requests are left out)."""
    total, count = await histogram_totals(session, urls, name)
    count -= since[1]
    return (total - since[0]) / count if count else None
