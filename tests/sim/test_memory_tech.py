"""The memory-technology prior of a GPU's memory efficiency (GpuSpec.memory_type): the physics
directions, and how a catalogue entry takes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenplane.sim.catalog import DEFAULT_MEM_EFFICIENCY, Catalog
from tokenplane.sim.errors import CatalogError
from tokenplane.sim.memory_tech import (
    MEMORY_TYPES,
    READ_FRACTION,
    mem_efficiency_prior,
    memory_type_ratio,
)
from tokenplane.sim.perf_model import StepTimeModel

ROOT = Path(__file__).resolve().parents[2]
SHEET = {"hbm_gib": 24, "hbm_bw_gbps": 1008, "bf16_tflops": 165.2, "price_per_hour": 0.69}


def _gpu(memory_type: str | None, **extra: float) -> Catalog:
    entry: dict[str, object] = {**SHEET, **extra}
    if memory_type is not None:
        entry["memory_type"] = memory_type
    return Catalog.default().with_overrides({"gpus": {"card": entry}})


def test_gddr_reaches_more_of_its_datasheet_than_the_reference_hbm() -> None:
    # The source's ordering: GDDR6 streams at 0.98 of its datasheet, HBM2 0.96, HBM2e 0.91.
    assert READ_FRACTION["gddr6"] > READ_FRACTION["hbm2"] > READ_FRACTION["hbm2e"]
    assert memory_type_ratio("gddr6") > memory_type_ratio("hbm2") > memory_type_ratio("hbm2e") == 1.0
    assert memory_type_ratio("gddr6x") == memory_type_ratio("gddr6")


@pytest.mark.parametrize("memory_type", [None, "hbm2e", "hbm3", "hbm3e", "gddr7"])
def test_without_a_figure_the_prior_is_the_documented_mean(memory_type: str | None) -> None:
    assert mem_efficiency_prior(memory_type) == pytest.approx(DEFAULT_MEM_EFFICIENCY)


@pytest.mark.parametrize("memory_type", MEMORY_TYPES)
def test_the_prior_is_an_efficiency(memory_type: str) -> None:
    assert DEFAULT_MEM_EFFICIENCY <= mem_efficiency_prior(memory_type) <= 1.0
    assert mem_efficiency_prior(memory_type.upper()) == mem_efficiency_prior(memory_type)


def test_unknown_memory_type_is_refused() -> None:
    with pytest.raises(ValueError, match="ddr5"):
        memory_type_ratio("ddr5")
    with pytest.raises(CatalogError, match="memory_type"):
        _gpu("ddr5")


def test_an_entry_with_its_memory_type_takes_the_prior() -> None:
    g = _gpu("GDDR6X").gpu("card")
    assert g.memory_type == "gddr6x"
    assert g.mem_efficiency == pytest.approx(mem_efficiency_prior("gddr6x"))
    assert g.mem_efficiency > DEFAULT_MEM_EFFICIENCY
    assert _gpu(None).gpu("card").mem_efficiency == pytest.approx(DEFAULT_MEM_EFFICIENCY)


def test_a_stated_or_fitted_efficiency_wins_over_the_prior() -> None:
    assert _gpu("gddr6", mem_efficiency=0.7).gpu("card").mem_efficiency == 0.7
    cat = Catalog.default()
    fitted = cat.gpu("h100").mem_efficiency
    # Overriding a known GPU keeps its fitted efficiency; replace: true defines it afresh.
    kept = cat.with_overrides({"gpus": {"h100": {"memory_type": "hbm2"}}}).gpu("h100")
    assert kept.mem_efficiency == fitted and kept.memory_type == "hbm2"
    fresh = cat.with_overrides({"gpus": {"h100": {"replace": True, **SHEET, "memory_type": "hbm2"}}})
    assert fresh.gpu("h100").mem_efficiency == pytest.approx(mem_efficiency_prior("hbm2"))


@given(memory_type=st.sampled_from(MEMORY_TYPES), n=st.integers(1, 64), big=st.integers(8192, 65536))
def test_the_prior_shortens_memory_bound_steps_by_its_ratio(memory_type: str, n: int, big: int) -> None:
    model = Catalog.default().model("llama-3.1-8b")
    base = StepTimeModel(_gpu(None).gpu("card"), model)
    prior = StepTimeModel(_gpu(memory_type).gpu("card"), model)
    ratio = memory_type_ratio(memory_type)
    # Weight and KV reads take 1/ratio of the time; nothing gets slower.
    assert prior.weights_read_s == pytest.approx(base.weights_read_s / ratio)
    assert prior.decode_kv_s_per_token == pytest.approx(base.decode_kv_s_per_token / ratio)
    assert prior.step_time(n, 1000 * n, 0) <= base.step_time(n, 1000 * n, 0)
    # Compute-bound steps (large prefill) barely move: the prior is a memory term only.
    assert prior.prefill_s_per_pair == base.prefill_s_per_pair
    gain_small = base.linear_time(1) / prior.linear_time(1)
    gain_big = base.linear_time(big) / prior.linear_time(big)
    assert gain_big <= gain_small <= ratio + 1e-12


def test_the_datasheet_example_states_memory_types_and_stays_as_documented() -> None:
    cat = Catalog.from_yaml(ROOT / "examples" / "catalog-datasheet.yaml")
    rtx, pro = cat.gpu("rtx4090"), cat.gpu("rtxpro6000")
    assert (rtx.memory_type, pro.memory_type) == ("gddr6x", "gddr7")
    assert (rtx.mem_efficiency, rtx.compute_efficiency) == (0.95, 0.85)  # the file's stated fit
    assert pro.mem_efficiency == pytest.approx(DEFAULT_MEM_EFFICIENCY)  # GDDR7: no figure
