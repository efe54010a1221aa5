"""KV transfer between emulated instances: vLLM's disaggregated prefill/decode, NixlConnector's flow.

Started with ``--kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'`` (the
same flag and JSON as vLLM), an instance plays either role, as vLLM's ``kv_both`` does:

* **prefill**: a request whose ``kv_transfer_params`` has ``do_remote_decode: true`` runs as usual
  (the caller asks for one token); its answer carries the parameters a decode instance needs, as
  vLLM 0.32's ``NixlConnectorScheduler.request_finished`` builds them (``do_remote_prefill: true``,
  ``remote_engine_id``, ``remote_request_id``, ``remote_block_ids``, ``remote_host``,
  ``remote_port``, ``tp_size``, ``remote_num_tokens``...). The instance holds that KV until a decode
  instance pulls it or its lease ends (vLLM's ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``, 480 s).
* **decode**: a request with ``do_remote_prefill: true`` first pulls the KV from the instance the
  parameters name, over its side channel (here the instance's own HTTP port:
  ``POST /kv_transfer/pull``), waiting the transfer time (bytes over ``link_gb_per_s``); the pulled
  blocks enter the engine's prefix cache, so the prompt is not computed again (counted as vLLM
  counts them: ``vllm:external_prefix_cache_hits``, not the local ``prefix_cache_hits``). If the
  pull fails (the prefill engine is gone, or no longer holds the KV, or the engine id does not
  match), ``kv_load_failure_policy: fail`` (vLLM's default) fails the request as vLLM does: a plain
  request answers 500 ``Internal server error``, a stream sends its role chunk then an error event;
  ``recompute`` computes the prompt locally instead.

Parameters missing a field vLLM needs are ignored with a warning, as vLLM does (the prompt is
computed locally); fields of the wrong type are refused with 400 naming the field (vLLM would fail
inside the engine).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)

CONNECTORS = ("NixlConnector",)
ROLES = ("kv_both", "kv_producer", "kv_consumer")
PULL_PATH = "/kv_transfer/pull"
DEFAULT_LEASE_S = 480.0  # vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT
DEFAULT_LINK_GB_PER_S = 50.0  # one 400 Gb/s RDMA NIC
MAX_HELD = 4096  # handovers held at once; the oldest lease goes first beyond
REQUIRED = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size")


class KvParamsError(ValueError):
    """``kv_transfer_params`` with a field of the wrong type (answered 400, naming the field)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class KvTransferConfig:
    """vLLM's ``--kv-transfer-config``, the fields the emulator reads."""

    kv_connector: str = "NixlConnector"
    kv_role: str = "kv_both"
    kv_load_failure_policy: str = "fail"
    lease_s: float = DEFAULT_LEASE_S
    link_gb_per_s: float = DEFAULT_LINK_GB_PER_S

    @property
    def produces(self) -> bool:
        return self.kv_role in ("kv_both", "kv_producer")

    @property
    def consumes(self) -> bool:
        return self.kv_role in ("kv_both", "kv_consumer")


def parse_kv_transfer_config(text: str) -> KvTransferConfig:
    """The JSON of ``--kv-transfer-config``; ``ValueError`` naming what is wrong."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kv-transfer-config is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("--kv-transfer-config must be a JSON object")
    connector = raw.get("kv_connector")
    if connector not in CONNECTORS:
        raise ValueError(f"kv_connector {connector!r}: the emulator plays {', '.join(CONNECTORS)}")
    role = raw.get("kv_role", "kv_both")
    if role not in ROLES:
        raise ValueError(f"kv_role {role!r}: one of {', '.join(ROLES)}")
    policy = raw.get("kv_load_failure_policy", "fail")
    if policy not in ("fail", "recompute"):
        raise ValueError(f"kv_load_failure_policy {policy!r}: 'fail' or 'recompute'")
    extra = raw.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ValueError("kv_connector_extra_config must be a JSON object")
    lease = extra.get("lease_s", DEFAULT_LEASE_S)
    link = extra.get("link_gb_per_s", DEFAULT_LINK_GB_PER_S)
    if not isinstance(lease, (int, float)) or lease <= 0 or not isinstance(link, (int, float)) or link <= 0:
        raise ValueError("kv_connector_extra_config: lease_s and link_gb_per_s must be positive numbers")
    return KvTransferConfig(str(connector), str(role), str(policy), float(lease), float(link))


@dataclass(frozen=True, slots=True)
class RemotePrefill:
    """What a decode request's ``kv_transfer_params`` point at."""

    engine_id: str
    request_id: str
    host: str
    port: int
    block_ids: tuple[int, ...]
    num_tokens: int | None


def _field(params: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    v = params[key]
    if not isinstance(v, kind) or isinstance(v, bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise KvParamsError(
            f"kv_transfer_params.{key} must be {names}, got {type(v).__name__}", f"kv_transfer_params.{key}"
        )
    return v


def _block_ids(raw: Any) -> tuple[int, ...]:
    """vLLM 0.32 sends one list per KV cache group (``[[1, 2, 3]]``); older ones a flat list."""
    param = "kv_transfer_params.remote_block_ids"
    if not isinstance(raw, list):
        raise KvParamsError(f"{param} must be a list of block ids, got {type(raw).__name__}", param)
    flat: list[Any] = []
    for item in raw:
        flat.extend(item if isinstance(item, list) else [item])
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in flat):
        raise KvParamsError(f"{param} must hold non-negative integer block ids", param)
    return tuple(flat)


def remote_prefill(params: Any) -> RemotePrefill | None:
    """The remote KV a decode request asks for; ``None``: nothing to pull (no ``do_remote_prefill``,
    or a field vLLM needs is missing: vLLM then warns and computes the prompt itself).
    ``KvParamsError`` for a field of the wrong type."""
    if not isinstance(params, dict):
        raise KvParamsError("kv_transfer_params must be an object", "kv_transfer_params")
    if not params.get("do_remote_prefill"):
        return None
    missing = [k for k in (*REQUIRED, "remote_block_ids") if params.get(k) is None]
    if missing:
        log.warning("Got invalid KVTransferParams (missing %s): computing the prompt locally", missing)
        return None
    num = params.get("remote_num_tokens")
    return RemotePrefill(
        engine_id=_field(params, "remote_engine_id", str),
        request_id=_field(params, "remote_request_id", str),
        host=_field(params, "remote_host", str),
        port=_field(params, "remote_port", int),
        block_ids=_block_ids(params["remote_block_ids"]),
        num_tokens=_field(params, "remote_num_tokens", int) if num is not None else None,
    )


def wants_remote_decode(params: Any) -> bool:
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


@dataclass(slots=True)
class _Held:
    tokens: int
    blocks: int
    expires_at: float


class KvTransferMetrics:
    """vLLM's NIXL counters (``vllm:nixl_*``) and the emulator's own handover counts."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        names = ["model_name", "engine"]
        lv = (model_name, "0")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=registry).labels(*lv)

        self.failed = counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV cache transfers.")
        self.expired = counter("vllm:nixl_num_kv_expired_reqs", "Requests whose KV lease expired unread.")
        self.bytes = counter("tokenplane_emulator_kv_bytes_pulled", "KV bytes this instance pulled (decode).")
        self.pulled = counter("tokenplane_emulator_kv_pulls", "KV transfers this instance pulled (decode).")
        self.handovers = counter(
            "tokenplane_emulator_kv_handovers", "Prefills handed over for remote decode (prefill)."
        )
        self.served = counter("tokenplane_emulator_kv_pulls_served", "KV transfers read from this instance.")
        self.external_queries = counter(
            "vllm:external_prefix_cache_queries", "External prefix cache queries (KV connector), in tokens."
        )
        self.external_hits = counter(
            "vllm:external_prefix_cache_hits", "External prefix cache hits (KV connector), in tokens."
        )


class KvTransfer:
    """One instance's connector: the KV it holds for remote decode, and its pulls of remote KV."""

    def __init__(
        self, config: KvTransferConfig, metrics: KvTransferMetrics, kv_bytes_per_token: int, block_size: int
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.engine_id = str(uuid.uuid4())
        self.kv_bytes_per_token = kv_bytes_per_token
        self.block_size = block_size
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._next_block = 1
        self._session: aiohttp.ClientSession | None = None

    # -- prefill side ---------------------------------------------------------------------------
    def hand_over(self, request_id: str, prompt_tokens: int, host: str, port: int) -> dict[str, Any]:
        """Hold a finished prefill's KV and return the parameters a decode instance needs."""
        now = time.monotonic()
        self._expire(now)
        blocks = -(-prompt_tokens // self.block_size)
        first = self._next_block
        self._next_block += blocks
        self._held[request_id] = _Held(prompt_tokens, blocks, now + self.config.lease_s)
        while len(self._held) > MAX_HELD:
            self._held.popitem(last=False)
            self.metrics.expired.inc()
        self.metrics.handovers.inc()
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(range(first, first + blocks))],
            "remote_engine_id": self.engine_id,
            "remote_request_id": request_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": prompt_tokens,
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
        }

    def serve_pull(self, body: Any) -> tuple[int, dict[str, Any]]:
        """A decode instance reads held KV: (status, answer). The KV is released once read."""
        self._expire(time.monotonic())
        if not isinstance(body, dict):
            return 400, {"error": "body must be an object"}
        if body.get("remote_engine_id") != self.engine_id:
            return 404, {"error": f"engine id mismatch: this engine is {self.engine_id}"}
        held = self._held.pop(str(body.get("remote_request_id")), None)
        if held is None:
            return 404, {"error": "no KV held for that request (never prefilled here, read, or expired)"}
        self.metrics.served.inc()
        return 200, {"tokens": held.tokens, "blocks": held.blocks}

    def drop_all(self) -> None:
        """The engine lost every KV it held for remote decode (the ``kv_lost`` fault)."""
        self._held.clear()

    @property
    def held(self) -> int:
        return len(self._held)

    def _expire(self, now: float) -> None:
        while self._held:
            key, first = next(iter(self._held.items()))
            if first.expires_at > now:
                break
            del self._held[key]
            self.metrics.expired.inc()

    # -- decode side ----------------------------------------------------------------------------
    async def pull(self, remote: RemotePrefill, speed: float) -> int | str:
        """Read the KV ``remote`` names: the tokens it covers, or why it failed."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        url = f"http://{remote.host}:{remote.port}{PULL_PATH}"
        body = {"remote_engine_id": remote.engine_id, "remote_request_id": remote.request_id}
        try:
            async with self._session.post(url, json=body) as resp:
                answer = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            self.metrics.failed.inc()
            return f"KV transfer from {remote.host}:{remote.port} failed: {type(exc).__name__}"
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("tokens"), int):
            self.metrics.failed.inc()
            why = answer.get("error") if isinstance(answer, dict) else None
            return f"KV transfer from {remote.engine_id} failed ({status}): {why}"
        tokens = int(answer["tokens"])
        size = tokens * self.kv_bytes_per_token
        if size and self.config.link_gb_per_s:
            await asyncio.sleep(size / (self.config.link_gb_per_s * 1e9) / speed)
        self.metrics.pulled.inc()
        self.metrics.bytes.inc(size)
        return tokens

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


__all__ = [
    "KvParamsError",
    "KvTransfer",
    "KvTransferConfig",
    "KvTransferMetrics",
    "RemotePrefill",
    "parse_kv_transfer_config",
    "remote_prefill",
    "wants_remote_decode",
]
