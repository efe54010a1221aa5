"""Seven-axis placement: one table per axis, the seven-axis profile, and properties over arbitrary views."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenplane.core.errors import InvalidPolicyConfig
from tokenplane.core.registry import BuildContext, PluginSpec, build, names
from tokenplane.core.routing import WeightedRouter, build_router
from tokenplane.core.routing.base import FILTERS, SCORERS
from tokenplane.core.routing.placement import (
    DEFAULT_GPUS,
    GpuCatalogue,
    GpuFitScorer,
    GpuGenerationFilter,
    HbmHeadroomScorer,
    KvHeadroomFilter,
    LatencyBudgetScorer,
    TenantPriorityScorer,
    WeightsReadyFilter,
    WeightsReadyScorer,
    WorkflowAffinityScorer,
    remaining_budget_s,
    urgency,
)
from tokenplane.core.views import InstanceView, RequestInfo, RouteReason, WorkflowContext


def req(**kw: object) -> RequestInfo:
    kw.setdefault("prompt_tokens", 1000)
    kw.setdefault("max_output_tokens", 200)
    kw.setdefault("model", "m")
    return RequestInfo("r", **kw)  # type: ignore[arg-type]


def iv(iid: str, **kw: object) -> InstanceView:
    return InstanceView(iid, **kw)  # type: ignore[arg-type]


def ids(views: Sequence[InstanceView]) -> list[str]:
    return [v.instance_id for v in views]


def best(scores: Sequence[float], cands: Sequence[InstanceView]) -> str:
    return cands[max(range(len(scores)), key=scores.__getitem__)].instance_id


INTERACTIVE = req(latency_budget_s=0.5)
BATCH = req(latency_budget_s=3600.0)


# -- the catalogue and the signals ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ("H100", "h100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("h200-sxm", "h200"),
        ("A100-SXM4-80GB", "a100"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("tpu-v5e", None),
        ("", None),
    ],
)
def test_catalogue_lookup(gpu: str, expected: str | None) -> None:
    spec = GpuCatalogue(DEFAULT_GPUS).lookup(gpu)
    assert (spec.name if spec else None) == expected


def test_catalogue_params_merge_over_defaults() -> None:
    cat = GpuCatalogue.from_params(
        "x", {"a100": {"price_per_hour": 1.0}, "B200": {"generation": 10, "hbm_gib": 180, "bw_gbps": 8000}}
    )
    a100, b200 = cat.lookup("a100"), cat.lookup("b200")
    assert a100 is not None and a100.price_per_hour == 1.0 and a100.bw_gbps == 2039
    assert b200 is not None and b200.generation == 10 and b200.tflops > 0


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ({"b200": {"generation": 10}}, "needs"),
        ({"a100": {"bw": 1}}, "unknown params"),
        ({"a100": {"bw_gbps": 0}}, "bw_gbps"),
        ([1, 2], "mapping"),
    ],
)
def test_bad_catalogue(gpus: object, message: str) -> None:
    with pytest.raises(InvalidPolicyConfig, match=message):
        GpuCatalogue.from_params("scorer 'gpu-fit'", gpus)


@pytest.mark.parametrize(
    ("request_", "now", "expected"),
    [
        (req(), 0.0, None),
        (req(latency_budget_s=2.0, arrival_s=10.0), 11.0, 1.0),
        (req(workflow=WorkflowContext("w", step=3, total_steps=5, deadline_s=30.0)), 0.0, 10.0),
        (req(latency_budget_s=2.0, workflow=WorkflowContext("w", deadline_s=1.0)), 0.0, 1.0),
    ],
)
def test_remaining_budget(request_: RequestInfo, now: float, expected: float | None) -> None:
    assert remaining_budget_s(request_, now) == expected


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (req(latency_budget_s=0.5), 1.0),
        (req(latency_budget_s=600.0), 0.0),
        (req(priority=1), 1.0),
        (req(priority=0), 0.5),
        (req(priority=-3), 0.0),
    ],
)
def test_urgency(request_: RequestInfo, expected: float) -> None:
    assert urgency(request_, 0.0, 1.0, 60.0) == expected


# -- 1. GPU type fit -----------------------------------------------------------------------------

GPU_FLEET = [iv("h100", gpu="H100"), iv("a100", gpu="A100"), iv("l40s", gpu="L40S")]


@pytest.mark.parametrize(
    ("request_", "cands", "winner"),
    [
        (INTERACTIVE, GPU_FLEET, "h100"),  # fastest
        (req(priority=1), GPU_FLEET, "h100"),
        (BATCH, GPU_FLEET, "a100"),  # cheapest per token (L40S is cheaper per hour, not per token)
        (req(priority=-1), GPU_FLEET, "a100"),
        (BATCH, [iv("h100", gpu="H100"), iv("a100", gpu="A100", price_per_hour=3.0)], "h100"),
    ],
)
def test_gpu_fit_prefers(request_: RequestInfo, cands: list[InstanceView], winner: str) -> None:
    assert best(GpuFitScorer().score(request_, cands, now=0.0), cands) == winner


def test_gpu_fit_unknown_gpus_are_neutral() -> None:
    assert GpuFitScorer().score(INTERACTIVE, [iv("a", gpu="tpu"), iv("b")], now=0) == [0.5, 0.5]
    scores = GpuFitScorer().score(INTERACTIVE, [iv("a", gpu="tpu"), iv("b", gpu="H100")], now=0)
    assert scores == [0.5, 1.0]


@pytest.mark.parametrize(
    ("request_", "filt", "kept"),
    [
        (req(), GpuGenerationFilter(), ["h100", "a100", "x"]),
        (req(), GpuGenerationFilter(models={"m": (9, 0.0)}), ["h100", "x"]),  # unknown GPU passes
        (req(), GpuGenerationFilter(min_generation=9), ["h100", "x"]),
        (req(model="big"), GpuGenerationFilter(models={"big": (0, 100.0)}), ["x"]),
        (req(), GpuGenerationFilter(min_generation=11), ["x"]),
    ],
)
def test_gpu_generation(request_: RequestInfo, filt: GpuGenerationFilter, kept: list[str]) -> None:
    cands = [iv("h100", gpu="H100"), iv("a100", gpu="A100"), iv("x", gpu="mystery")]
    assert ids(filt.filter(request_, cands, now=0)) == kept


def test_gpu_generation_label_overrides_catalogue() -> None:
    cands = [iv("a", gpu="A100", labels={"gpu_generation": "9"}), iv("b", gpu="A100")]
    assert ids(GpuGenerationFilter(min_generation=9).filter(req(), cands, now=0)) == ["a"]


# -- 2. HBM headroom -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("views", "strict", "kept"),
    [
        # need = 1000 + 200 = 1200 tokens
        ([(10_000, 0.95), (10_000, 0.5), (0, 0.99)], False, ["i0", "i1", "i2"][1:]),  # 500 free: out
        ([(10_000, 0.5), (2_000, 0.0)], False, ["i0", "i1"]),
        ([(10_000, 0.95), (1_000, 0.0)], False, ["i0"]),  # none fits now: those that ever could
        ([(10_000, 0.95), (1_000, 0.0)], True, []),
        ([(1_000, 0.0), (800, 0.0)], False, []),  # too big for every instance
        ([(10_000, math.nan)], False, ["i0"]),  # NaN usage counts as full, but it could fit later
    ],
)
def test_kv_headroom(views: list[tuple[int, float]], strict: bool, kept: list[str]) -> None:
    cands = [iv(f"i{k}", kv_capacity_tokens=cap, kv_usage=u) for k, (cap, u) in enumerate(views)]
    assert ids(KvHeadroomFilter(strict=strict).filter(req(), cands, now=0)) == kept


def test_kv_headroom_keeps_same_object() -> None:
    cands = [iv("a", kv_capacity_tokens=100_000)]
    assert KvHeadroomFilter().filter(req(), cands, now=0) is cands


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (iv("a", kv_capacity_tokens=10_000, kv_usage=0.0), 1.0),  # 88 % free after placing
        (iv("a", kv_capacity_tokens=10_000, kv_usage=0.78), 0.4),  # 10 % free after placing
        (iv("a", kv_capacity_tokens=10_000, kv_usage=0.95), 0.0),  # does not fit
        (iv("a", gpu="H100", hbm_free_bytes=8 << 30), 0.4),  # 8 GiB − 1200 × 128 KiB ≈ 0.1 of 80 GiB
        (iv("a", gpu="H100", labels={"hbm_free_gib": "8"}), 0.4),
        (iv("a", kv_usage=0.5), 1.0),  # nothing but the usage
        (iv("a", kv_usage=math.nan), 0.0),
    ],
)
def test_hbm_headroom(view: InstanceView, expected: float) -> None:
    assert HbmHeadroomScorer().score(req(), [view], now=0) == [pytest.approx(expected, abs=0.01)]


# -- 4. Model-weight readiness -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("states", "kept"),
    [
        (["warm", "cold", "warming"], ["i0", "i2"]),
        (["cold", "cold"], ["i0", "i1"]),  # only cold ones: keep them rather than refuse
        (["cold"], ["i0"]),
        (["warm", "warm"], ["i0", "i1"]),
    ],
)
def test_weights_ready_filter(states: list[str], kept: list[str]) -> None:
    cands = [iv(f"i{k}", weights=s) for k, s in enumerate(states)]
    assert ids(WeightsReadyFilter().filter(req(), cands, now=0)) == kept


def test_weights_ready_keeps_cold_when_no_warm_instance_could_hold_the_request() -> None:
    cands = [iv("small", kv_capacity_tokens=1000), iv("big", weights="cold", kv_capacity_tokens=9000)]
    assert ids(WeightsReadyFilter().filter(req(), cands, now=0)) == ["small", "big"]
    assert seven().select(req(), cands, now=0).instance_id == "big"


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (iv("a"), 1.0),
        (iv("a", weights="warming"), 0.3),
        (iv("a", weights="COLD"), 0.0),
        (iv("a", labels={"weights_state": "cold"}), 0.0),  # an operator-set label
        (iv("a", labels={"weights_state": "loading"}), 0.3),
        (iv("a", weights="warming", labels={"weights_state": "cold"}), 0.3),  # typed field wins
        (iv("a", labels={"weights_state": "???"}), 1.0),  # unknown words read as warm
        (InstanceView("plain", labels={"weights_state": "warming"}), 0.3),
    ],
)
def test_weights_ready_scorer(view: InstanceView, expected: float) -> None:
    assert WeightsReadyScorer().score(req(), [view], now=0) == [expected]


# -- 5. Tenant priority --------------------------------------------------------------------------


def test_tenant_priority_mixes_load_and_importance() -> None:
    cands = [iv("idle"), iv("busy", running=3, waiting=4)]  # loads 1 and 8
    high = TenantPriorityScorer().score(req(priority=1), cands, now=0)
    low = TenantPriorityScorer().score(req(priority=-1), cands, now=0)
    standard = TenantPriorityScorer().score(req(priority=0), cands, now=0)
    assert high == pytest.approx([1 - 1 / 8, 0.0])
    assert low == pytest.approx([1 - 0.25 / 8, 0.75])
    assert standard == pytest.approx([1 - 0.5 / 8 - 0.125 / 8, 1 - 0.5 - 0.125])
    assert high[0] - high[1] > low[0] - low[1]  # high priority cares far more about load


def test_tenant_priority_high_prefers_the_faster_of_two_idle_low_does_not_care() -> None:
    cands = [iv("a100", gpu="A100"), iv("h100", gpu="H100")]
    assert best(TenantPriorityScorer().score(req(priority=1), cands, now=0), cands) == "h100"
    low = TenantPriorityScorer().score(req(priority=-1), cands, now=0)
    assert low[0] == low[1]


def test_tenant_priority_uses_the_freshest_queue() -> None:
    cands = [iv("a", outstanding_requests=9), iv("b", running=2)]
    assert best(TenantPriorityScorer().score(req(priority=1), cands, now=0), cands) == "b"


# -- 6. Workflow context -------------------------------------------------------------------------


def step(n: int, sunk: float = 0.0, wid: str = "w") -> RequestInfo:
    return req(workflow=WorkflowContext(wid, step=n, total_steps=5, sunk_cost_usd=sunk))


def test_workflow_affinity_returns_to_the_previous_instance() -> None:
    scorer = WorkflowAffinityScorer()
    cands = [iv("a"), iv("b"), iv("c")]
    assert scorer.score(step(1), cands, now=0) == [0.0, 0.0, 0.0]
    scorer.on_routed(step(1), "b", now=0)
    assert scorer.score(step(2), cands, now=1) == [0.0, 0.5, 0.0]
    assert scorer.score(step(2, wid="other"), cands, now=1) == [0.0, 0.0, 0.0]
    assert scorer.score(req(), cands, now=1) == [0.0, 0.0, 0.0]
    scorer.on_routed(step(2), "c", now=1)
    assert scorer.previous_instance("w") == "c"


@pytest.mark.parametrize(("sunk", "expected"), [(0.0, 0.5), (0.05, 0.816), (1.0, 1.0), (math.nan, 0.5)])
def test_workflow_affinity_grows_with_sunk_cost(sunk: float, expected: float) -> None:
    assert WorkflowAffinityScorer().affinity(sunk) == pytest.approx(expected, abs=1e-3)


def test_workflow_affinity_state_changes_only_in_on_routed() -> None:
    scorer = WorkflowAffinityScorer(max_workflows=2)
    for k in range(3):
        scorer.on_routed(step(1, wid=f"w{k}"), f"i{k}", now=k)
    before = scorer.snapshot()
    assert before == {"w1": "i1", "w2": "i2"}  # bounded: the oldest workflow went first
    scorer.score(step(2, wid="w1"), [iv("i1")], now=5)
    scorer.on_finished(step(2, wid="w1"), "i1", now=6)
    assert scorer.snapshot() == before
    scorer.forget("i1")
    assert scorer.snapshot() == {"w2": "i2"}


# -- 7. Latency budget ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (iv("idle", gpu="H100"), 1.0),  # 1000 / 20000 = 0.05 s of a 2 s budget
        (iv("queue", gpu="H100", waiting=40), 0.0),  # 10 s of queue
        (iv("some", gpu="H100", waiting=5), 0.7),  # 1.30 s: between comfort (1 s) and the budget
        (iv("cold", gpu="H100", weights="cold"), 0.0),  # a cold start blows it
        (iv("told", predicted_ttft_s=1.5), 0.5),  # the shell's prediction wins
        (iv("label", labels={"predicted_ttft_s": "0.2"}), 1.0),
        (iv("slow", gpu="A100", waiting=3), 0.61),  # 0.16 s prefill + 1.23 s queue of 2 s
    ],
)
def test_latency_budget(view: InstanceView, expected: float) -> None:
    scores = LatencyBudgetScorer().score(req(latency_budget_s=2.0), [view], now=0)
    assert scores == [pytest.approx(expected, abs=0.01)]


def test_latency_budget_without_budget_or_when_spent() -> None:
    cands = [iv("a", waiting=100), iv("b")]
    assert LatencyBudgetScorer().score(req(), cands, now=0) == [1.0, 1.0]
    assert LatencyBudgetScorer().score(req(latency_budget_s=1.0), cands, now=5) == [0.0, 0.0]


def test_latency_budget_uses_the_workflow_deadline_share() -> None:
    late = req(workflow=WorkflowContext("w", step=4, total_steps=5, deadline_s=3.0))  # 1.5 s a step
    cands = [iv("a", gpu="H100", waiting=8), iv("b", gpu="H100")]  # 2.05 s and 0.05 s
    assert LatencyBudgetScorer().score(late, cands, now=0) == [0.0, 1.0]


# -- the seven-axis profile ----------------------------------------------------------------------


def seven(params: dict[str, object] | None = None, seed: int = 0) -> WeightedRouter:
    router = build_router({"name": "seven-axis", "params": params or {}}, random.Random(seed))
    assert isinstance(router, WeightedRouter) and router.name == "seven-axis"
    return router


def test_every_plugin_is_registered() -> None:
    assert "seven-axis" in names("router")
    assert {"gpu-generation", "kv-headroom", "weights-ready"} <= set(names("filter"))
    expected = {"gpu-fit", "hbm-headroom", "weights-ready", "tenant-priority", "workflow-affinity"}
    assert expected | {"latency-budget", "prefix-overlap"} <= set(names("scorer"))


def test_seven_axis_defaults() -> None:
    router = seven()
    assert [f.name for f in router.filters] == ["gpu-generation", "weights-ready", "kv-headroom"]
    assert {s.name: w for s, w in router.scorers} == {
        "prefix-overlap": 2.0,
        "latency-budget": 2.0,
        "tenant-priority": 3.0,
        "workflow-affinity": 0.5,
        "gpu-fit": 1.0,
        "hbm-headroom": 1.0,
        "weights-ready": 1.0,
    }


def test_seven_axis_reweights_and_drops() -> None:
    router = seven({"weights": {"gpu-fit": 5, "hbm-headroom": 0}})
    weights = {s.name: w for s, w in router.scorers}
    assert weights["gpu-fit"] == 5.0 and "hbm-headroom" not in weights


def test_seven_axis_hands_its_catalogue_to_every_gpu_aware_part() -> None:
    router = seven({"gpus": {"a100": {"price_per_hour": 0.5}}})
    fit = next(s for s, _ in router.scorers if s.name == "gpu-fit")
    assert isinstance(fit, GpuFitScorer)
    a100 = fit.catalogue.lookup("A100")
    assert a100 is not None and a100.price_per_hour == 0.5


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"weights": {"nope": 1}}, "not in the profile"),
        ({"weights": [1]}, "must map"),
        ({"weights": {"gpu-fit": -1}}, "weight"),
        ({"gpus": {"a100": {"bw_gbps": -1}}}, "bw_gbps"),
        ({"scorers": [{"name": "gpu-fit", "params": {"interactive_s": 9, "relaxed_s": 3}}]}, "relaxed_s"),
        ({"filters": [{"name": "kv-headroom", "params": {"strict": "yes"}}]}, "strict"),
        ({"extra": 1}, "unknown params"),
    ],
)
def test_seven_axis_bad_params(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidPolicyConfig, match=message):
        build_router({"name": "seven-axis", "params": params}, random.Random())


@pytest.mark.parametrize(
    ("spec", "cls"),
    [
        (PluginSpec("scorer", "gpu-fit", {"relaxed_s": 30}), GpuFitScorer),
        (
            PluginSpec("filter", "gpu-generation", {"models": {"m": {"min_generation": 9}}}),
            GpuGenerationFilter,
        ),
        (PluginSpec("filter", "kv-headroom", {"strict": True}), KvHeadroomFilter),
        (PluginSpec("scorer", "hbm-headroom", {"saturate_at": 0.5}), HbmHeadroomScorer),
        (PluginSpec("filter", "weights-ready"), WeightsReadyFilter),
        (PluginSpec("scorer", "weights-ready", {"warming_score": 0.5}), WeightsReadyScorer),
        (PluginSpec("scorer", "tenant-priority", {"low_priority_load_weight": 0}), TenantPriorityScorer),
        (PluginSpec("scorer", "workflow-affinity", {"max_workflows": 10}), WorkflowAffinityScorer),
        (PluginSpec("scorer", "latency-budget", {"comfort": 0.8}), LatencyBudgetScorer),
    ],
)
def test_parts_build_through_the_registry(spec: PluginSpec, cls: type) -> None:
    family = FILTERS if spec.kind == "filter" else SCORERS
    assert isinstance(build(spec, BuildContext(random.Random()), family), cls)


def test_seven_axis_avoids_cold_and_returns_to_the_workflow() -> None:
    router = seven()
    cands = [iv("cold", gpu="H100", weights="cold"), iv("a", gpu="H100"), iv("b", gpu="H100")]
    first = router.select(step(1), cands, now=0)
    assert first.instance_id in {"a", "b"} and first.reason is RouteReason.WEIGHTED_SCORE
    router.on_routed(step(1), "b", now=0)
    assert router.select(step(2, sunk=0.1), cands, now=1).instance_id == "b"
    router.forget("b")
    assert router.select(step(2, sunk=0.1), cands, now=1).instance_id == "a"
    only_cold = [iv("cold", weights="cold")]
    assert router.select(step(1), only_cold, now=0).instance_id == "cold"


def test_seven_axis_interactive_to_fast_batch_to_cheap() -> None:
    router = seven()
    cands = [iv("a100", gpu="A100"), iv("h100", gpu="H100")]
    assert router.select(req(priority=1, latency_budget_s=0.5), cands, now=0).instance_id == "h100"
    assert router.select(req(priority=-1, latency_budget_s=3600.0), cands, now=0).instance_id == "a100"


def test_seven_axis_no_candidates_when_nothing_can_hold_the_request() -> None:
    router = seven()
    cands = [iv("a", kv_capacity_tokens=500), iv("b", kv_capacity_tokens=800)]
    assert router.select(req(), cands, now=0).reason is RouteReason.NO_CANDIDATES


def test_plain_weighted_profile_forwards_hooks_to_stateful_scorers() -> None:
    router = build_router(
        {"name": "weighted", "params": {"scorers": ["workflow-affinity", "queue-depth"]}}, random.Random()
    )
    assert isinstance(router, WeightedRouter) and router.name == "weighted"
    cands = [iv("a"), iv("b")]
    router.on_routed(step(1), "b", now=0)
    router.on_finished(step(1), "b", now=1)
    assert router.select(step(2), cands, now=2).instance_id == "b"


# -- properties ----------------------------------------------------------------------------------

GPU_NAMES = ["H100", "A100", "h200", "L40S", "rtx 4090", "", "weird"]
label_values = st.sampled_from(["warm", "warming", "cold", "9", "8.5", "nan", "-3", "x", "1e400"])
labels = st.dictionaries(
    st.sampled_from(["weights_state", "gpu_generation", "hbm_free_gib", "predicted_ttft_s"]), label_values
)
views = st.builds(
    InstanceView,
    instance_id=st.sampled_from([f"i{k}" for k in range(8)]),
    gpu=st.sampled_from(GPU_NAMES),
    ready=st.booleans(),
    healthy=st.booleans(),
    outstanding_requests=st.integers(-2, 60),
    outstanding_tokens=st.integers(0, 50_000),
    running=st.integers(0, 20),
    waiting=st.integers(0, 40),
    kv_usage=st.floats(-0.5, 1.5) | st.just(math.nan),
    kv_capacity_tokens=st.integers(0, 20_000),
    price_per_hour=st.floats(0, 10),
    labels=labels,
    weights=st.sampled_from(["warm", "warming", "cold", "odd"]),
    hbm_free_bytes=st.integers(0, 100 << 30),
    predicted_ttft_s=st.floats(0, 100) | st.just(math.nan) | st.just(math.inf),
)
plain_views = st.builds(
    InstanceView,
    instance_id=st.sampled_from([f"i{k}" for k in range(8)]),
    gpu=st.sampled_from(GPU_NAMES),
    ready=st.booleans(),
    waiting=st.integers(0, 40),
    kv_usage=st.floats(-0.5, 1.5) | st.just(math.nan),
    kv_capacity_tokens=st.integers(0, 20_000),
    labels=labels,
)
candidate_lists = st.lists(views | plain_views, max_size=8, unique_by=lambda v: v.instance_id)
workflows = st.none() | st.builds(
    WorkflowContext,
    workflow_id=st.sampled_from(["w0", "w1", "w2"]),
    step=st.integers(1, 6),
    total_steps=st.none() | st.integers(1, 6),
    sunk_cost_usd=st.floats(-1, 10) | st.just(math.nan) | st.just(math.inf),
    deadline_s=st.none() | st.floats(-10, 1000),
)
requests = st.builds(
    RequestInfo,
    request_id=st.just("r"),
    model=st.sampled_from(["m", "big"]),
    prompt_tokens=st.integers(0, 8000),
    max_output_tokens=st.integers(0, 2000),
    block_hashes=st.lists(st.integers(0, 5), max_size=8).map(
        lambda bs: tuple(hash((0, *bs[:k])) for k in range(1, len(bs) + 1))
    ),
    priority=st.integers(-3, 3),
    arrival_s=st.floats(0, 10),
    workflow=workflows,
    latency_budget_s=st.none() | st.floats(-5, 100) | st.just(math.nan),
) | st.builds(RequestInfo, request_id=st.just("r"), model=st.just("m"), prompt_tokens=st.integers(0, 99),
              max_output_tokens=st.integers(0, 99), workflow=workflows)  # fmt: skip


def all_scorers() -> list[object]:
    return [
        GpuFitScorer(),
        HbmHeadroomScorer(),
        WeightsReadyScorer(),
        TenantPriorityScorer(),
        WorkflowAffinityScorer(),
        LatencyBudgetScorer(),
    ]


@settings(max_examples=200, deadline=None)
@given(
    request=requests,
    cands=candidate_lists,
    history=st.lists(st.tuples(requests, st.sampled_from(["i0", "i1", "i2"])), max_size=6),
    now=st.floats(0, 50),
)
def test_scores_are_within_unit_interval(
    request: RequestInfo, cands: list[InstanceView], history: list[tuple[RequestInfo, str]], now: float
) -> None:
    for scorer in all_scorers():
        if isinstance(scorer, WorkflowAffinityScorer):
            for t, (past, iid) in enumerate(history):
                scorer.on_routed(past, iid, now=float(t))
        scores = scorer.score(request, cands, now=now)  # type: ignore[attr-defined]
        assert len(scores) == len(cands)
        assert all(0.0 <= s <= 1.0 for s in scores), (scorer, scores)


def can_never_hold(request: RequestInfo, view: InstanceView) -> bool:
    """What justifies a NO_CANDIDATES from the default profile's hard filters."""
    need = request.prompt_tokens + request.max_output_tokens
    too_small = 0 < view.kv_capacity_tokens < need
    gen = GpuGenerationFilter().filter(request, [view], now=0)
    return too_small or not gen


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(st.tuples(requests, candidate_lists), min_size=1, max_size=12),
    seed=st.integers(0, 2**32),
    picker=st.sampled_from(["max-score", {"name": "random-top", "params": {"top_k": 3}}]),
)
def test_seven_axis_picks_a_usable_candidate_or_no_candidates(
    steps: list[tuple[RequestInfo, list[InstanceView]]], seed: int, picker: object
) -> None:
    router = seven({"record_scores": True, "max_blocks_per_instance": 6, "picker": picker}, seed)
    affinity = next(s for s, _ in router.scorers if isinstance(s, WorkflowAffinityScorer))
    for t, (request, cands) in enumerate(steps):
        before = (router.index.snapshot(), affinity.snapshot())
        d = router.select(request, cands, now=float(t))
        assert (router.index.snapshot(), affinity.snapshot()) == before  # select never changes state
        usable = [v for v in cands if v.ready and v.healthy]
        if d.instance_id is None:
            assert d.reason is RouteReason.NO_CANDIDATES
            assert all(can_never_hold(request, v) for v in usable)
        else:
            assert d.instance_id in {v.instance_id for v in usable}
            assert d.scores is not None and all(0.0 <= s <= 1.0 for s in d.scores.values())
            router.on_routed(request, d.instance_id, now=float(t))
            if request.workflow is not None:
                assert affinity.previous_instance(request.workflow.workflow_id) == d.instance_id
            router.on_finished(request, d.instance_id, now=t + 0.5)


def test_view_fields_roundtrip() -> None:
    """The placement fields are plain fields of the views (no getattr fallback needed)."""
    assert msgspec.structs.replace(iv("a", weights="cold"), weights="warm").weights == "warm"
