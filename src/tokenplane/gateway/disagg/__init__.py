"""Prefill/decode disaggregation at the gateway: vLLM's KV-transfer request flow over a pool of
prefill and decode instances (:mod:`.flow`), with retries and stream continuation on either side.

The modules: :mod:`.config` (the pool kind and instance roles), :mod:`.pools` (each disaggregated
model's pair router and the counters), :mod:`.prefill` (one prefill attempt: its handover),
:mod:`.decode_check` (a decode answer checked for a failed KV load before the client sees it),
:mod:`.flow` (the stage that drives the core retry plan over (prefill, decode) pairs).
"""
