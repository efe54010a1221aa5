"""The disaggregated request path: prefill on one instance, move the KV, decode on another.

:class:`DisaggDispatch` is a fleet :class:`~tokenplane.sim.fleet.Dispatcher`. Per request:

1. the core's pair policy (:mod:`tokenplane.core.routing.pd`) picks a (prefill, decode) pair from
   the two pools' views;
2. the prefill instance computes the prompt and samples one token (vLLM's ``max_tokens: 1``
   prefill request; the token is not the client's);
3. handoff: the pair policy chooses the decode instance again from the decode pool's views of that
   moment (the prefill side fixed), and that instance reserves KV blocks for the prompt; while it
   cannot, the request waits in that instance's gate (FIFO, retried as its sequences finish);
4. the KV moves in :func:`~tokenplane.sim.disagg.transfer_seconds`; only when it has arrived is the
   request submitted to the decode instance, which admits it with the prompt computed, computes
   the last prompt position and streams every output token (the client's TTFT is its first).

Failures (scenario ``faults`` of kind ``lose``, with ``replace_after_s``; ``slow`` too):

* a prefill instance lost with the request queued or prefilling, or before its KV reached the
  decode instance (the prefill instance holds the KV until the transfer completes, as vLLM's
  connector does): the request is prefilled again on another pair (``reprefills_prefill_lost``);
* a decode instance lost before the KV arrived (reserved or gated there): the KV is sent again to
  another decode instance (``retransfers``);
* a decode instance lost mid-decode: the KV there is gone; the request continues as a
  continuation (prompt plus the tokens already streamed) prefilled on a prefill instance and moved
  to another decode instance, which streams the rest (``decode_lost_continued``).

No request is lost: one that finds no pair while a lost instance is due back waits for it
(``parked``) and fails (reason ``no_instance``) only when none is. Economics: each leg (prefill,
decode, and any re-prefill or continuation) is an attempt that its instance's bill is split over,
so a clean request counts two. Simplifications: the prefill instance frees its blocks when its step
ends (they stay in its prefix cache), rather than holding them through the transfer; the decode
instance does not add transferred prompts to its own prefix cache.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from tokenplane.core.routing.pd import PairDecision, build_pair_router
from tokenplane.core.views import InstanceView, RequestInfo
from tokenplane.sim.disagg import DisaggSettings, transfer_seconds
from tokenplane.sim.engine import ContinuousEngine, Seq
from tokenplane.sim.faults import FaultSpec
from tokenplane.sim.fleet import Fleet, request_info
from tokenplane.sim.records import RequestRecord
from tokenplane.sim.workloads.base import RequestSpec

PREFILL, GATED, TRANSFER, DECODE = "prefill", "gated", "transfer", "decode"
# no pair now, but a lost instance will be back: wait to prefill, or to hand the KV over
PARKED_PREFILL, PARKED_HANDOFF = "parked-prefill", "parked-handoff"
_replace = msgspec.structs.replace


class PdRequest:
    """One request's progress through the pair; mutable, private to the dispatcher."""

    __slots__ = (
        "blocks",
        "decode",
        "delivered",
        "epoch",
        "info",
        "lost_at",
        "phase",
        "prefill",
        "rec",
        "spec",
    )

    def __init__(self, spec: RequestSpec, info: RequestInfo, rec: RequestRecord) -> None:
        self.spec = spec
        self.info = info
        self.rec = rec
        self.phase = PREFILL
        self.prefill: ContinuousEngine | None = None
        self.decode: ContinuousEngine | None = None
        self.delivered = 0  # output tokens streamed before a decode instance was lost
        self.lost_at = 0.0
        self.blocks = 0  # KV blocks reserved on the decode instance for the transfer
        self.epoch = 0  # bumped at each re-route: stale transfer arrivals are ignored

    def leg(self) -> tuple[RequestSpec, RequestInfo]:
        """This leg's request: after a decode loss, the prompt plus what was streamed."""
        if not self.delivered:
            return self.spec, self.info
        spec, d = self.spec, self.delivered
        leg = _replace(spec, prompt_tokens=spec.prompt_tokens + d, output_tokens=spec.output_tokens - d)
        maxout = max(1, (spec.max_output_tokens or spec.output_tokens) - d)
        return leg, _replace(self.info, prompt_tokens=leg.prompt_tokens, max_output_tokens=maxout)


class DisaggDispatch:
    def __init__(
        self,
        settings: DisaggSettings,
        roles: Mapping[str, str],
        kv_bytes_per_token: Mapping[str, float],
        faults: Sequence[FaultSpec] = (),
    ) -> None:
        for f in faults:
            if f.kind == "drain":
                raise ValueError("disaggregated runs model faults of kind lose and slow, not drain")
        self.settings = settings
        self.link = settings.link
        self.pair = build_pair_router(settings.pair)
        self.roles = dict(roles)
        self.kv_bytes = dict(kv_bytes_per_token)
        self.faults = list(faults)
        self.by_uid: dict[int, PdRequest] = {}
        self.handoffs: dict[int, PdRequest] = {}  # request_id -> request, while gated or in transfer
        self.counters = {
            "kv_transfers": 0,
            "kv_waits": 0,
            "reprefills_prefill_lost": 0,
            "retransfers": 0,
            "decode_lost_continued": 0,
            "parked": 0,
        }
        self.transfer_s: list[float] = []
        self.parked: list[PdRequest] = []
        self.revivals = 0  # lost instances whose replacement is scheduled
        # economics: one (request_id, instance_id, prefill tokens computed, output tokens, useful)
        # row per leg, so each instance's bill is split among the legs it ran
        self.usage: list[tuple[int, str, int, int, bool]] = []
        self.transfer_bytes = 0.0

    def bind(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.loop = fleet.loop
        engines: list[ContinuousEngine] = []
        for e in fleet.engines:
            if not isinstance(e, ContinuousEngine):
                raise ValueError("disaggregation needs the continuous engine")
            engines.append(e)
        self.engines = engines
        self.by_id = {e.id: e for e in engines}
        self.p_idx = [i for i, e in enumerate(engines) if self.roles.get(e.id) == "prefill"]
        self.d_idx = [i for i, e in enumerate(engines) if self.roles.get(e.id) == "decode"]
        if not self.p_idx or not self.d_idx:
            raise ValueError("disaggregation needs at least one prefill and one decode instance")
        self.gated: dict[str, deque[PdRequest]] = {engines[i].id: deque() for i in self.d_idx}
        fleet.usage = self.usage

    # -- the request path ----------------------------------------------------------------------
    def admit(self, now: float, spec: RequestSpec) -> None:
        fleet = self.fleet
        rec = fleet.open_record(now, spec)
        info = request_info(spec, now, fleet.model, self._cached(spec) if fleet.precise_kv else None)
        self._prefill(now, PdRequest(spec, info, rec))

    def _cached(self, spec: RequestSpec) -> dict[str, int]:
        out: dict[str, int] = {}
        if spec.block_hashes:
            for i in self.p_idx:
                n = self.engines[i].cached_prefix_tokens(spec)
                if n:
                    out[self.engines[i].id] = n
        return out

    def _pools(self) -> tuple[list[InstanceView], list[InstanceView]]:
        views = self.fleet.fresh_views()
        return [views[i] for i in self.p_idx], [views[i] for i in self.d_idx]

    def _select(self, req: PdRequest, now: float, *, prefill_fixed: bool = False) -> PairDecision:
        info = req.leg()[1]
        pre, dec = self._pools()
        if prefill_fixed and req.prefill is not None:
            pre = [v for v in pre if v.instance_id == req.prefill.id]
        return self.pair.select_pair(info, pre, dec, now=now)

    def _prefill(self, now: float, req: PdRequest) -> None:
        req.epoch += 1
        decision = self._select(req, now)
        req.rec.route_reason = str(decision.reason)
        if decision.prefill_id is None or decision.decode_id is None:
            self._no_pair(req, now, PARKED_PREFILL)
            return
        p, d = self.by_id[decision.prefill_id], self.by_id[decision.decode_id]
        spec, info = req.leg()
        pspec = _replace(spec, output_tokens=1, max_output_tokens=1)
        if not p.fits(pspec) or not d.fits(spec):
            self._fail(req, now, "too_long")
            return
        req.prefill, req.decode, req.phase = p, d, PREFILL
        req.rec.instance_id = d.id
        scratch = RequestRecord(req.spec.request_id, spec.tenant, now, spec.prompt_tokens, 1)
        self._submit(p, pspec, _replace(info, max_output_tokens=1), scratch, req, now)

    def _submit(
        self,
        engine: ContinuousEngine,
        spec: RequestSpec,
        info: RequestInfo,
        rec: RequestRecord,
        req: PdRequest,
        now: float,
    ) -> Seq:
        fleet = self.fleet
        fleet.uid += 1
        fleet.in_flight += 1
        seq = Seq(fleet.uid, spec, info, rec, fleet.bs)
        self.by_uid[seq.uid] = req
        if req.phase == DECODE:
            seq.hashes, seq.nbh, seq.hblock = (), 0, 1
            seq.remote = spec.prompt_tokens - 1
            seq.private, req.blocks = req.blocks, 0
            if req.delivered:
                seq.last_token_s = req.lost_at  # the stream's gap counts as one long token gap
        engine.submit(seq, now)
        return seq

    def on_finish(self, seq: Seq, now: float) -> None:
        fleet = self.fleet
        req = self.by_uid.pop(seq.uid)
        fleet.in_flight -= 1
        rec = req.rec
        rid = req.spec.request_id
        if req.phase == PREFILL:
            leg = seq.record
            self.usage.append(
                (rid, req.prefill.id if req.prefill else "", seq.prompt - leg.prefix_hit_tokens, 1, True)
            )
            if rec.scheduled_s is None:
                rec.scheduled_s = leg.scheduled_s
                rec.prefix_hit_tokens = leg.prefix_hit_tokens
            rec.preemptions += leg.preemptions
            self._handoff(now, req)
            return
        self.usage.append((rid, req.decode.id if req.decode else "", 1, seq.generated, True))
        rec.finish_s = now
        rec.ok = True
        fleet.last_activity = max(fleet.last_activity, now)
        fleet.followups(req.spec, now, ok=True)
        if req.decode is not None:
            self._drain(req.decode, now)

    def _blocks(self, req: PdRequest, engine: ContinuousEngine) -> int:
        return -(-req.leg()[0].prompt_tokens // engine.bs)

    def _handoff(self, now: float, req: PdRequest) -> None:
        # The decode side is chosen again now, from views that show the decode pool as it is when
        # the KV is ready to move (as a proxy that sends the decode request after the prefill one
        # returned does); the choice at arrival only checked that a decode instance existed.
        decision = self._select(req, now, prefill_fixed=True)
        if decision.decode_id is None:
            self.handoffs[req.spec.request_id] = req  # the prefill instance holds its KV meanwhile
            req.decode = None
            self._no_pair(req, now, PARKED_HANDOFF)
            return
        d = req.decode = self.by_id[decision.decode_id]
        if not d.fits(req.leg()[0]):  # a decode pool of mixed sizes: this one cannot hold it
            self._fail(req, now, "too_long")
            return
        req.rec.instance_id = d.id
        self.handoffs[req.spec.request_id] = req
        gate = self.gated[d.id]
        blocks = self._blocks(req, d)
        if not gate and d.kv.allocate(blocks):
            d.changed.add(d.index)
            self._transfer(now, req, blocks)
        else:
            req.phase = GATED
            gate.append(req)
            self.counters["kv_waits"] += 1

    def _drain(self, d: ContinuousEngine, now: float) -> None:
        gate = self.gated[d.id]
        while gate:
            req = gate[0]
            blocks = self._blocks(req, d)
            if not d.kv.allocate(blocks):
                return
            gate.popleft()
            d.changed.add(d.index)
            self._transfer(now, req, blocks)

    def _transfer(self, now: float, req: PdRequest, blocks: int) -> None:
        req.phase = TRANSFER
        req.blocks = blocks
        tokens = req.leg()[0].prompt_tokens
        per_token = self.kv_bytes[req.decode.id] if req.decode is not None else 0.0
        dt = transfer_seconds(tokens, per_token, self.link)
        self.counters["kv_transfers"] += 1
        self.transfer_s.append(dt)
        self.transfer_bytes += tokens * per_token
        self.loop.schedule(now + dt, self._arrived, (req, req.epoch))

    def _arrived(self, now: float, arg: object) -> None:
        assert isinstance(arg, tuple)
        req, epoch = arg
        if epoch != req.epoch or req.phase != TRANSFER or req.decode is None:
            return
        del self.handoffs[req.spec.request_id]
        req.phase = DECODE
        spec, info = req.leg()
        self._submit(req.decode, spec, info, req.rec, req, now)

    def _no_pair(self, req: PdRequest, now: float, step: str) -> None:
        """No pair now: wait for a lost instance that will be back, or fail when none will."""
        if self.revivals > 0:
            req.phase = step
            self.parked.append(req)
            self.counters["parked"] += 1
        else:
            self._fail(req, now, "no_instance")

    def _fail(self, req: PdRequest, now: float, reason: str) -> None:
        self.handoffs.pop(req.spec.request_id, None)
        rec = req.rec
        rec.ok = False
        rec.reason = reason
        rec.finish_s = None
        self.fleet.followups(req.spec, now, ok=False)

    # -- faults --------------------------------------------------------------------------------
    def start(self) -> None:
        for f in self.faults:
            if f.instance >= len(self.engines):
                raise ValueError(f"fault on instance {f.instance}: the fleet has {len(self.engines)}")
            self.loop.schedule(f.at_s, self._apply_fault, f)

    def _apply_fault(self, now: float, fault: FaultSpec) -> None:
        engine = self.engines[fault.instance]
        if fault.kind == "slow":
            engine.set_slow(fault.factor, now)
            if fault.duration_s is not None:
                self.loop.schedule(now + fault.duration_s, self._restore_speed, engine)
            return
        if fault.replace_after_s is not None:
            self.revivals += 1
            self.loop.schedule(now + fault.replace_after_s, self._replace_engine, engine)
        self.lose(engine, now)

    def _restore_speed(self, now: float, engine: object) -> None:
        assert isinstance(engine, ContinuousEngine)
        engine.set_slow(1.0, now)

    def _replace_engine(self, now: float, engine: object) -> None:
        assert isinstance(engine, ContinuousEngine)
        engine.ready = True
        engine.set_slow(1.0, now)
        engine.changed.add(engine.index)
        self.revivals -= 1
        if engine.id in self.gated:
            self._drain(engine, now)
        parked, self.parked = self.parked, []
        for req in parked:
            if req.phase == PARKED_PREFILL:
                self._prefill(now, req)
            elif req.phase == PARKED_HANDOFF:
                self._handoff(now, req)

    def lose(self, engine: ContinuousEngine, now: float) -> None:
        """``engine`` dies: everything in it and every handoff that depended on it moves on."""
        engine.ready = False
        engine.changed.add(engine.index)
        moved: list[PdRequest] = []
        for seq in engine.fail_all(now):
            req = self.by_uid.pop(seq.uid)
            self.fleet.in_flight -= 1
            rid = req.spec.request_id
            self.usage.append(
                (
                    rid,
                    engine.id,
                    seq.computed if req.phase == PREFILL else 1,
                    seq.generated,
                    seq.generated > 0,
                )
            )
            if req.phase == PREFILL:
                self.counters["reprefills_prefill_lost"] += 1
            else:
                req.delivered += seq.generated
                req.lost_at = now
                req.rec.interrupted = req.rec.interrupted or seq.generated > 0
                self.counters["decode_lost_continued"] += 1
                if req.delivered >= req.spec.output_tokens:  # the loss came after its last token
                    req.rec.finish_s, req.rec.ok = now, True
                    self.fleet.followups(req.spec, now, ok=True)
                    continue
            moved.append(req)
        for req in list(self.handoffs.values()):
            if req.prefill is engine:  # the KV's source died before it arrived: prefill again
                self._cancel_handoff(req)
                self.counters["reprefills_prefill_lost"] += 1
                moved.append(req)
            elif req.decode is engine:  # the reservation (or the place in the gate) is gone
                self._cancel_handoff(req, reserved_gone=True)
                req.decode = None
                self.counters["retransfers"] += 1
                self._handoff(now, req)
        for req in moved:
            self._prefill(now, req)

    def _cancel_handoff(self, req: PdRequest, *, reserved_gone: bool = False) -> None:
        self.handoffs.pop(req.spec.request_id, None)
        d = req.decode
        if req.phase == PARKED_HANDOFF:
            self.parked.remove(req)
        elif req.phase == GATED and d is not None:
            self.gated[d.id].remove(req)
        elif req.phase == TRANSFER and d is not None and req.blocks and not reserved_gone:
            d.kv.release_private(req.blocks)
            d.changed.add(d.index)
        req.blocks = 0
        req.epoch += 1

    # -- reporting -----------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.handoffs or self.parked)

    def report_extra(self) -> dict[str, Any]:
        ts = self.transfer_s
        return {
            "disaggregation": {
                "prefill_instances": len(self.p_idx),
                "decode_instances": len(self.d_idx),
                "link_gb_per_s": self.link.bandwidth / 1e9,
                "link_latency_s": self.link.latency,
                "kv_transfer_gb": self.transfer_bytes / 1e9,
                "kv_transfer_s_mean": math.fsum(ts) / len(ts) if ts else None,
                "kv_transfer_s_max": max(ts) if ts else None,
                **self.counters,
            }
        }
