"""LoRA adapters in the twin: which ones each instance holds, and what loading one costs.

(Which requests ask for an adapter is the workload option ``adapters``:
:mod:`tokenplane.sim.workloads.adapters`.)

:class:`AdapterSlots` is one instance's ``max_adapters`` GPU slots (vLLM's
``--max-loras``), kept in LRU order. A request whose adapter is not resident loads it when the engine
admits it to prefill; the load stalls that engine step for ``load_s`` (vLLM loads adapters
synchronously in the model runner, before the forward pass), and evicts the least recently used
adapter that no running request uses. When every slot is used by running requests, the request
waits at the head of the queue (vLLM's scheduler skips it instead; the twin keeps FCFS).

Load time assumption (:class:`LoraSettings`): ``load_fixed_s + adapter_mb / (load_gb_per_s x 1000)``:
the adapter's weights read from host storage and copied to HBM at an effective bandwidth. A rank-64
adapter on every linear layer of an 8B Llama is about 335 MB in bf16; from local NVMe at ~2 GB/s
effective (safetensors read plus the copy) that is about 0.17 s. With adapters cached in pinned host
memory (vLLM's ``--max-cpu-loras``) PCIe Gen5 gives ~25 GB/s: set ``load_gb_per_s`` accordingly.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LoraSettings(BaseModel):
    """An engine's LoRA slots and what loading one adapter costs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_adapters: int = Field(4, gt=0)
    adapter_mb: float = Field(335.0, gt=0)
    load_gb_per_s: float = Field(2.0, gt=0)
    load_fixed_s: float = Field(0.0, ge=0)

    @property
    def load_s(self) -> float:
        return self.load_fixed_s + self.adapter_mb / (self.load_gb_per_s * 1000.0)


class AdapterSlots:
    """One instance's resident adapters (LRU) and how many running requests use each."""

    __slots__ = ("_resident_view", "active", "load_s", "loads", "max_adapters", "resident")

    def __init__(self, max_adapters: int, load_s: float) -> None:
        if max_adapters <= 0:
            raise ValueError(f"max_adapters must be > 0, got {max_adapters}")
        self.max_adapters = max_adapters
        self.load_s = load_s
        self.resident: dict[str, None] = {}  # least recently used first
        self.active: dict[str, int] = {}
        self.loads = 0
        self._resident_view: frozenset[str] = frozenset()

    def can_admit(self, adapter: str) -> bool:
        """A request for ``adapter`` can start now (resident, a free slot, or an idle one to evict)."""
        if adapter in self.resident or len(self.resident) < self.max_adapters:
            return True
        return any(a not in self.active for a in self.resident)

    def admit(self, adapter: str) -> float:
        """Start a request for ``adapter`` (after :meth:`can_admit`); the seconds its load stalls."""
        cost = 0.0
        if adapter in self.resident:
            del self.resident[adapter]
        else:
            if len(self.resident) >= self.max_adapters:
                victim = next(a for a in self.resident if a not in self.active)
                del self.resident[victim]
            self.loads += 1
            cost = self.load_s
        self.resident[adapter] = None
        self.active[adapter] = self.active.get(adapter, 0) + 1
        self._resident_view = frozenset(self.resident)
        return cost

    def release(self, adapter: str) -> None:
        """A running request for ``adapter`` left the batch (finished, preempted or aborted)."""
        left = self.active.get(adapter, 0) - 1
        if left > 0:
            self.active[adapter] = left
        else:
            self.active.pop(adapter, None)

    def clear(self) -> None:
        """The instance lost its GPU state."""
        self.resident.clear()
        self.active.clear()
        self._resident_view = frozenset()

    @property
    def view(self) -> frozenset[str]:
        return self._resident_view
