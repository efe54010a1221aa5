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
    CARD_FRACTION,
    FLUIDX3D,
    MEMORY_TYPES,
    READ_FRACTION,
    REFERENCE_CARDS,
    REFERENCE_READ_FRACTION,
    bandwidth_fraction,
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


def test_the_source_figures_are_the_tables_own_efficiencies() -> None:
    # FluidX3D prints the roofline efficiency, rounded to 1 %: the figures here reproduce it.
    assert round(100 * bandwidth_fraction(17602, 3350)) == 80  # H100 SXM5 80GB HBM3
    assert round(100 * bandwidth_fraction(10228, 2039)) == 77  # A100 SXM4 80GB
    assert round(100 * bandwidth_fraction(5624, 1008)) == 85  # RTX 4090
    assert round(100 * bandwidth_fraction(10349, 1792)) == 88  # RTX PRO 6000 Blackwell
    assert all(0.6 < f < 1.0 for f in CARD_FRACTION.values())
    # Every memory type has cards, and the reference is the two chips the documented mean was
    # fitted on (A100 SXM4 80 GB, HBM2e; H100 SXM, HBM3), not the H100 PCIe.
    assert {t for _, t, _, _ in FLUIDX3D} == set(MEMORY_TYPES)
    assert REFERENCE_CARDS == ("A100 SXM4 80GB", "H100 SXM5 80GB HBM3")
    assert abs(REFERENCE_READ_FRACTION - 0.786) < 5e-4
    assert CARD_FRACTION["H100 PCIe 80GB HBM2e"] > CARD_FRACTION["H100 SXM5 80GB HBM3"]


def test_gddr_reaches_more_of_its_datasheet_than_the_reference_hbm() -> None:
    # The source's ordering of the medians: GDDR6 0.89, GDDR6X 0.85, GDDR7 0.82 above HBM3 0.79
    # and HBM2e 0.78, both within 1.1 % of the reference chips.
    assert READ_FRACTION["gddr6"] > READ_FRACTION["gddr6x"] > READ_FRACTION["gddr7"]
    assert READ_FRACTION["gddr7"] > READ_FRACTION["hbm3"] > READ_FRACTION["hbm2e"]
    assert memory_type_ratio("gddr6x") == pytest.approx(1.083, abs=1e-3)
    assert memory_type_ratio("gddr7") == pytest.approx(1.050, abs=1e-3)
    for hbm in ("hbm2e", "hbm3"):
        assert memory_type_ratio(hbm) == pytest.approx(1.0, abs=0.011)


def test_without_a_memory_type_the_prior_is_the_documented_mean() -> None:
    assert mem_efficiency_prior(None) == pytest.approx(DEFAULT_MEM_EFFICIENCY)


@pytest.mark.parametrize("memory_type", MEMORY_TYPES)
def test_the_prior_is_an_efficiency(memory_type: str) -> None:
    assert 0.0 < mem_efficiency_prior(memory_type) <= 1.0
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
def test_the_prior_scales_memory_bound_steps_by_its_ratio(memory_type: str, n: int, big: int) -> None:
    model = Catalog.default().model("llama-3.1-8b")
    base = StepTimeModel(_gpu(None).gpu("card"), model)
    prior = StepTimeModel(_gpu(memory_type).gpu("card"), model)
    ratio = memory_type_ratio(memory_type)
    # Weight and KV reads take 1/ratio of the time (HBM2e sits just below the reference: ratio < 1).
    assert prior.weights_read_s == pytest.approx(base.weights_read_s / ratio)
    assert prior.decode_kv_s_per_token == pytest.approx(base.decode_kv_s_per_token / ratio)
    faster = prior.step_time(n, 1000 * n, 0) <= base.step_time(n, 1000 * n, 0)
    assert faster == (ratio >= 1.0)
    # Compute-bound steps (large prefill) barely move: the prior is a memory term only.
    assert prior.prefill_s_per_pair == base.prefill_s_per_pair
    # The speed-up (or slow-down) shrinks towards 1 as the step turns compute-bound.
    gain_small = base.linear_time(1) / prior.linear_time(1)
    gain_big = base.linear_time(big) / prior.linear_time(big)
    lo, hi = sorted((1.0, ratio))
    assert lo - 1e-12 <= gain_big <= hi + 1e-12 and lo - 1e-12 <= gain_small <= hi + 1e-12
    assert abs(gain_big - 1.0) <= abs(gain_small - 1.0) + 1e-12


def test_the_datasheet_example_states_memory_types_and_stays_as_documented() -> None:
    cat = Catalog.from_yaml(ROOT / "examples" / "catalog-datasheet.yaml")
    rtx, pro = cat.gpu("rtx4090"), cat.gpu("rtxpro6000")
    assert (rtx.memory_type, pro.memory_type) == ("gddr6x", "gddr7")
    assert rtx.mem_efficiency == pytest.approx(mem_efficiency_prior("gddr6x"))  # no fit stated
    assert pro.mem_efficiency == pytest.approx(mem_efficiency_prior("gddr7"))  # GDDR7's prior
