"""Catalogue files: the schema of a ``gpus:``/``models:`` entry (pydantic), merging entries over a
catalogue's known GPUs and models, and reading a catalogue YAML file. A model entry may take its
shape from a Hugging Face ``config.json`` (:mod:`tokenplane.sim.hf_config`); a GPU entry may be
given by datasheet figures alone (``replace: true``; its efficiencies then default to the
documented means in :mod:`tokenplane.sim.catalog_specs`, its memory efficiency to the prior of its
``memory_type`` when it gives one: :mod:`tokenplane.sim.memory_tech`, its compute efficiency to
the prior of its measured ``matmul_tflops``: :mod:`tokenplane.sim.matmul_prior`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tokenplane.sim.catalog_specs import (
    DEFAULT_COMPUTE_EFFICIENCY,
    DEFAULT_KNEE_SHARPNESS,
    DEFAULT_KV_READ_EFFICIENCY,
    DEFAULT_LAYER_OVERHEAD_S,
    DEFAULT_MEM_EFFICIENCY,
    DEFAULT_STEP_OVERHEAD_S,
    GpuSpec,
    ModelSpec,
    gpu_key,
    model_key,
)
from tokenplane.sim.errors import CatalogError
from tokenplane.sim.matmul_prior import compute_efficiency_prior
from tokenplane.sim.memory_tech import MemoryType, mem_efficiency_prior


# --- Config schema (pydantic) ---------------------------------------------------------------------
class GpuConfig(BaseModel):
    """A GPU entry in user configuration; every field optional when overriding a known GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hbm_gib: float = Field(gt=0)
    hbm_bw_gbps: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)
    price_per_hour: float = Field(ge=0)
    interconnect_gbps: float | None = Field(default=None, gt=0)
    interconnect: Literal["nvlink", "pcie"] = "pcie"
    interconnect_latency_us: float | None = Field(default=None, gt=0)
    mem_efficiency: float = Field(default=DEFAULT_MEM_EFFICIENCY, gt=0, le=1)
    compute_efficiency: float = Field(default=DEFAULT_COMPUTE_EFFICIENCY, gt=0, le=1)
    step_overhead_s: float = Field(default=DEFAULT_STEP_OVERHEAD_S, ge=0)
    layer_overhead_s: float = Field(default=DEFAULT_LAYER_OVERHEAD_S, ge=0)
    knee_sharpness: float = Field(default=DEFAULT_KNEE_SHARPNESS, ge=1)
    kv_read_efficiency: float = Field(default=DEFAULT_KV_READ_EFFICIENCY, gt=0, le=1)
    memory_type: MemoryType | None = None
    matmul_tflops: float | None = Field(default=None, gt=0)
    aliases: tuple[str, ...] = ()

    @field_validator("memory_type", mode="before")
    @classmethod
    def _lower_memory_type(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v


class ModelConfig(BaseModel):
    """A model entry in user configuration; every field optional when overriding a known model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    params_b: float = Field(gt=0)
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab: int = Field(gt=0)
    dtype_bytes: int = Field(default=2, gt=0)
    tie_embeddings: bool = False
    aliases: tuple[str, ...] = ()
    experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    expert_intermediate: int = Field(default=0, ge=0)
    shared_intermediate: int = Field(default=0, ge=0)
    moe_layers: int = Field(default=0, ge=0)
    attn_params: int = Field(default=0, ge=0)
    kv_dim: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check_moe(self) -> ModelConfig:
        if self.experts or self.moe_layers:
            if not 0 < self.moe_layers <= self.layers:
                raise ValueError(f"moe_layers must be in 1..layers ({self.layers}) for a MoE model")
            if not 0 < self.experts_per_token <= self.experts:
                raise ValueError(f"experts_per_token must be in 1..experts ({self.experts})")
            if self.expert_intermediate <= 0:
                raise ValueError("expert_intermediate must be > 0 for a MoE model")
        return self


class CatalogConfig(BaseModel):
    """Top level of a catalogue YAML file: ``gpus:`` and ``models:`` keyed by name."""

    model_config = ConfigDict(extra="forbid")

    gpus: dict[str, dict[str, Any]] = Field(default_factory=dict)
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)


def _format_validation_error(prefix: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        parts.append(f"{loc}: {e['msg']}")
    return "invalid catalogue entry: " + "; ".join(parts)


def _hf_fields(where: str, fields: dict[str, Any], base_dir: str | Path | None) -> dict[str, Any] | None:
    """Pop ``hf_config``/``config`` from a model entry and return the shape they give (or None)."""
    from tokenplane.sim.hf_config import HfConfigError, load_hf_config, model_fields

    path = fields.pop("hf_config", None)
    inline = fields.pop("config", None)
    if path is None and inline is None:
        return None
    if path is not None and inline is not None:
        raise CatalogError(f"invalid catalogue entry: {where}: give hf_config or config, not both")
    try:
        if path is not None:
            if not isinstance(path, str):
                raise HfConfigError("hf_config must be a path to a config.json")
            file = Path(path)
            if not file.is_absolute() and base_dir is not None:
                file = Path(base_dir) / file
            return model_fields(load_hf_config(file))
        return model_fields(inline)
    except HfConfigError as e:
        key = "hf_config" if path is not None else "config"
        raise CatalogError(f"invalid catalogue entry: {where}.{key}: {e}") from e


def merge_entries(
    mapping: Mapping[str, Any],
    known_gpus: Iterable[GpuSpec],
    known_models: Iterable[ModelSpec],
    find_gpu: Callable[[str], GpuSpec | None],
    find_model: Callable[[str], ModelSpec | None],
    base_dir: str | Path | None = None,
) -> tuple[list[GpuSpec], list[ModelSpec]]:
    """The known GPUs and models with ``mapping``'s entries added or merged in (see
    :meth:`tokenplane.sim.catalog.Catalog.with_overrides` for the rules)."""
    try:
        cfg = CatalogConfig.model_validate(mapping)
    except ValidationError as e:
        raise CatalogError(_format_validation_error("", e)) from e
    gpus = {g.name: g for g in known_gpus}
    models = {m.name: m for m in known_models}
    for name, raw in cfg.gpus.items():
        fields = dict(raw or {})
        replace = fields.pop("replace", False)
        if not isinstance(replace, bool):
            raise CatalogError(f"invalid catalogue entry: gpus.{name}.replace: must be true or false")
        existing = find_gpu(name)
        base: dict[str, Any] = {}
        if existing is not None:
            if not replace:
                base = dataclasses.asdict(existing)
                base.pop("name")
            else:  # its own figures only; the known names still lead to it
                base = {"aliases": existing.aliases}
            gpus.pop(existing.name)
        try:
            gc = GpuConfig.model_validate({**base, **fields})
        except ValidationError as e:
            raise CatalogError(_format_validation_error(f"gpus.{name}", e)) from e
        own_figures = existing is None or replace
        if gc.memory_type is not None and "mem_efficiency" not in fields and own_figures:
            # Defined from its own figures, with its memory but no efficiency: the memory
            # technology's prior instead of the documented mean (a known GPU's fit is inherited).
            gc = gc.model_copy(update={"mem_efficiency": mem_efficiency_prior(gc.memory_type)})
        if gc.matmul_tflops is not None and "compute_efficiency" not in fields and own_figures:
            # Likewise its measured matmul throughput (tokenplane.sim.matmul_prior).
            prior = compute_efficiency_prior(gc.matmul_tflops, gc.bf16_tflops)
            gc = gc.model_copy(update={"compute_efficiency": prior})
        new_name = existing.name if existing is not None else gpu_key(name)
        gpus[new_name] = GpuSpec(name=new_name, **gc.model_dump())
    for name, raw in cfg.models.items():
        fields = dict(raw or {})
        existing_m = find_model(name)
        base = {}
        hf = _hf_fields(f"models.{name}", fields, base_dir)
        if existing_m is not None:
            if hf is None:
                base = dataclasses.asdict(existing_m)
                base.pop("name")
            else:  # a whole new shape; the known names still lead to it
                base = {"aliases": existing_m.aliases}
            models.pop(existing_m.name)
        try:
            mc = ModelConfig.model_validate({**base, **(hf or {}), **fields})
        except ValidationError as e:
            raise CatalogError(_format_validation_error(f"models.{name}", e)) from e
        new_name = existing_m.name if existing_m is not None else model_key(name)
        models[new_name] = ModelSpec(name=new_name, **mc.model_dump())
    return list(gpus.values()), list(models.values())


def read_catalog_file(path: str | Path) -> Mapping[str, Any]:
    """A catalogue YAML file's top-level mapping (empty for an empty file)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise CatalogError(f"cannot read catalogue file {p}: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise CatalogError(f"catalogue file {p}: top level must be a mapping with gpus:/models:")
    return data
