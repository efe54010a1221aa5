"""The disaggregated pool kind in the gateway config: what is accepted and what is refused (with
the field named)."""

from __future__ import annotations

from typing import Any

import pytest

from tokenplane.gateway import ConfigError, parse_config


def config(pool: Any = None, roles: tuple[str, ...] = ("prefill", "decode"), kind: str = "emulated") -> dict:
    model: dict[str, Any] = {"name": "m"}
    if pool is not None:
        model["pool"] = pool
    return {
        "models": [model],
        "instances": [
            {"id": f"i{n}", "url": f"http://127.0.0.1:{9000 + n}", "model": "m", "kind": kind, "role": role}
            for n, role in enumerate(roles)
        ],
    }


def test_a_disaggregated_pool_with_both_sides_loads() -> None:
    c = parse_config(
        config({"kind": "disaggregated", "pair_router": {"name": "pd-pair", "params": {"kv_weight": 2}}})
    )
    assert c.models[0].pool.disaggregated
    assert [i.role for i in c.instances] == ["prefill", "decode"]
    both = parse_config(config({"kind": "disaggregated"}, roles=("both",)))
    assert both.instances[0].role == "both"
    assert not parse_config(config(roles=("both",))).models[0].pool.disaggregated  # colocated by default


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (config(None), "instances[0].role: 'prefill' needs model 'm' to have pool: {kind: disaggregated}"),
        (config({"kind": "disaggregated"}, roles=("prefill", "prefill")), "has no decode instance"),
        (config({"kind": "disaggregated"}, roles=("decode",)), "has no prefill instance"),
        (config({"kind": "disaggregated"}, kind="llamacpp"), "instances[0].kind: a llamacpp instance cannot"),
        (config({"kind": "disaggregated", "pair_router": "nope"}), "models[0].pool.pair_router"),
        (config({"kind": "split"}), "models[0].pool.kind"),
        (config({"kind": "disaggregated", "prefill_timeout_s": 0}), "models[0].pool.prefill_timeout_s"),
    ],
)
def test_pool_misconfigurations_are_refused_naming_the_field(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert message in str(info.value)
