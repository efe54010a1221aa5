"""Hardware and model catalogue for the fleet simulator: :class:`Catalog` looks GPUs
(:class:`GpuSpec`) and models (:class:`ModelSpec`) up by name (case-insensitive, with aliases such as
``meta-llama/Llama-3.1-8B``) and accepts user additions and overrides from a mapping or a YAML file,
validated by pydantic.

The pieces live by concept, all re-exported here: the spec types, calibrated efficiency constants
(with where each comes from) and name normalisation in :mod:`tokenplane.sim.catalog_specs`; the
built-in GPUs (datasheet figures) and models in :mod:`tokenplane.sim.catalog_builtin`; the file
schema, merging and YAML reading in :mod:`tokenplane.sim.catalog_file`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tokenplane.sim.catalog_builtin import BUILTIN_GPUS, BUILTIN_MODELS
from tokenplane.sim.catalog_file import CatalogConfig as CatalogConfig
from tokenplane.sim.catalog_file import GpuConfig as GpuConfig
from tokenplane.sim.catalog_file import ModelConfig as ModelConfig
from tokenplane.sim.catalog_file import merge_entries, read_catalog_file
from tokenplane.sim.catalog_specs import A100_COMPUTE_EFFICIENCY as A100_COMPUTE_EFFICIENCY
from tokenplane.sim.catalog_specs import A100_KNEE_SHARPNESS as A100_KNEE_SHARPNESS
from tokenplane.sim.catalog_specs import A100_LAYER_OVERHEAD_S as A100_LAYER_OVERHEAD_S
from tokenplane.sim.catalog_specs import A100_MEM_EFFICIENCY as A100_MEM_EFFICIENCY
from tokenplane.sim.catalog_specs import A100_STEP_OVERHEAD_S as A100_STEP_OVERHEAD_S
from tokenplane.sim.catalog_specs import (
    DEFAULT_ACTIVATION_RESERVE_GIB,
    GIB,
    gpu_key,
    model_candidates,
    model_key,
)
from tokenplane.sim.catalog_specs import DEFAULT_COMPUTE_EFFICIENCY as DEFAULT_COMPUTE_EFFICIENCY
from tokenplane.sim.catalog_specs import DEFAULT_KNEE_SHARPNESS as DEFAULT_KNEE_SHARPNESS
from tokenplane.sim.catalog_specs import DEFAULT_LAYER_OVERHEAD_S as DEFAULT_LAYER_OVERHEAD_S
from tokenplane.sim.catalog_specs import DEFAULT_MEM_EFFICIENCY as DEFAULT_MEM_EFFICIENCY
from tokenplane.sim.catalog_specs import DEFAULT_STEP_OVERHEAD_S as DEFAULT_STEP_OVERHEAD_S
from tokenplane.sim.catalog_specs import H100_COMPUTE_EFFICIENCY as H100_COMPUTE_EFFICIENCY
from tokenplane.sim.catalog_specs import H100_KNEE_SHARPNESS as H100_KNEE_SHARPNESS
from tokenplane.sim.catalog_specs import H100_LAYER_OVERHEAD_S as H100_LAYER_OVERHEAD_S
from tokenplane.sim.catalog_specs import H100_MEM_EFFICIENCY as H100_MEM_EFFICIENCY
from tokenplane.sim.catalog_specs import H100_STEP_OVERHEAD_S as H100_STEP_OVERHEAD_S
from tokenplane.sim.catalog_specs import GpuSpec as GpuSpec
from tokenplane.sim.catalog_specs import ModelSpec as ModelSpec
from tokenplane.sim.errors import CatalogError as CatalogError
from tokenplane.sim.errors import UnknownHardware as UnknownHardware


class Catalog:
    """Immutable name → :class:`GpuSpec` / :class:`ModelSpec` lookup with aliases."""

    def __init__(self, gpus: Iterable[GpuSpec], models: Iterable[ModelSpec]) -> None:
        self._gpus: dict[str, GpuSpec] = {}
        self._models: dict[str, ModelSpec] = {}
        self._gpu_alias: dict[str, str] = {}
        self._model_alias: dict[str, str] = {}
        for g in gpus:
            self._gpus[g.name] = g
        for m in models:
            self._models[m.name] = m
        for g in self._gpus.values():
            for a in (g.name, *g.aliases):
                self._gpu_alias[gpu_key(a)] = g.name
        for m in self._models.values():
            for a in (m.name, *m.aliases):
                self._model_alias[model_key(a)] = m.name

    # -- construction --
    @classmethod
    def default(cls) -> Catalog:
        return cls(BUILTIN_GPUS, BUILTIN_MODELS)

    def with_overrides(self, mapping: Mapping[str, Any], *, base_dir: str | Path | None = None) -> Catalog:
        """A new catalogue with ``mapping['gpus']`` / ``mapping['models']`` added or merged in.

        An entry whose name matches a known GPU/model (aliases included) overrides only the fields
        it gives; a new name must give every required field. A GPU entry with ``replace: true`` is
        defined from its own figures only (a known GPU's calibrated efficiencies are then not
        inherited: they default to the documented means; its name and aliases are kept). A model
        entry with ``hf_config: PATH`` (a Hugging Face config.json; relative to ``base_dir``,
        default the working directory) or ``config: {...}`` (the same fields inline) takes its
        whole shape from that config (see :mod:`tokenplane.sim.hf_config`; a known model's name
        and aliases are kept); other fields it gives (``aliases``, ``params_b``...) are applied on
        top. Raises :class:`CatalogError` naming the offending field.
        """
        gpus, models = merge_entries(
            mapping, self._gpus.values(), self._models.values(), self._find_gpu, self._find_model, base_dir
        )
        return Catalog(gpus, models)

    @classmethod
    def from_yaml(cls, path: str | Path, base: Catalog | None = None) -> Catalog:
        """The default (or ``base``) catalogue with the YAML file's ``gpus:``/``models:`` merged in."""
        data = read_catalog_file(path)
        try:
            return (base or cls.default()).with_overrides(data, base_dir=Path(path).parent)
        except CatalogError as e:
            raise CatalogError(f"{Path(path)}: {e}") from e

    # -- lookup --
    def _find_gpu(self, name: str) -> GpuSpec | None:
        key = self._gpu_alias.get(gpu_key(name))
        return None if key is None else self._gpus[key]

    def _find_model(self, name: str) -> ModelSpec | None:
        for cand in model_candidates(name):
            key = self._model_alias.get(cand)
            if key is not None:
                return self._models[key]
        return None

    def gpu(self, name: str | GpuSpec) -> GpuSpec:
        if isinstance(name, GpuSpec):
            return name
        g = self._find_gpu(name)
        if g is None:
            raise UnknownHardware("gpu", name, self._gpus)
        return g

    def model(self, name: str | ModelSpec) -> ModelSpec:
        if isinstance(name, ModelSpec):
            return name
        m = self._find_model(name)
        if m is None:
            raise UnknownHardware("model", name, self._models)
        return m

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._gpus))

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._models))


def kv_capacity_tokens(
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_gib: float = DEFAULT_ACTIVATION_RESERVE_GIB,
    block_size: int | None = None,
) -> int:
    """KV-cache capacity in tokens of one replica spread over ``tp`` GPUs, as vLLM sizes it.

    Per GPU, ``hbm x utilization - weights / tp - activation reserve`` bytes go to the KV cache, and
    each rank holds a 1/tp share of every token's KV (``1/kv_heads`` when ``tp > kv_heads``: KV
    heads are then replicated). Rounded down to whole ``block_size`` blocks when given; never
    negative.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    per_rank_free = gpu.hbm_bytes * gpu_memory_utilization - model.weight_bytes / tp
    per_rank_free -= activation_reserve_gib * GIB
    if per_rank_free <= 0:
        return 0
    kv_per_token_per_rank = model.kv_bytes_per_token * max(1.0, tp / model.kv_heads) / tp
    tokens = int(per_rank_free // kv_per_token_per_rank)
    if block_size:
        tokens -= tokens % block_size
    return tokens
