"""The serving side of the KV connector (:mod:`.kv_transfer`): what a request carrying
``kv_transfer_params`` does before it is submitted, how a failed KV load is answered (as vLLM 0.32
answers ``finish_reason: error``), and the side channel a decode instance pulls KV through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from tokenplane.emulator.instance import EmulatedInstance
from tokenplane.emulator.kv_transfer import remote_prefill, wants_remote_decode
from tokenplane.emulator.routes import _instance, error_response

Handover = Callable[[str, int], dict[str, Any]]
"""Called with (request id, prompt tokens) once a prefill finished: the answer's ``kv_transfer_params``."""

_encode = msgspec.json.Encoder().encode
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
INTERNAL_ERROR = "Internal server error"  # vLLM's GenerationError message


def _address(request: web.Request) -> tuple[str, int]:
    """Where this instance was reached: the side channel a decode instance pulls from."""
    transport = request.transport
    name = transport.get_extra_info("sockname") if transport is not None else None
    if isinstance(name, tuple) and len(name) >= 2:
        return str(name[0]), int(name[1])
    host, _, port = (request.host or "127.0.0.1:80").rpartition(":")
    return host or "127.0.0.1", int(port) if port.isdigit() else 80


async def connector_step(
    request: web.Request, inst: EmulatedInstance, params: Any, hashes: tuple[int, ...], stream: bool
) -> tuple[Handover | None, bool, int]:
    """Before a request with ``kv_transfer_params`` is submitted: (its handover, when it is a
    prefill for remote decode; whether its KV load failed and the request must fail; the prompt
    tokens whose KV was pulled). A decode request pulls the KV its parameters name now and puts it
    in the prefix cache."""
    transfer = inst.kv_transfer
    assert transfer is not None
    remote = remote_prefill(params)  # raises KvParamsError on a field of the wrong type
    handover: Handover | None = None
    if wants_remote_decode(params) and transfer.config.produces and not stream:
        host, port = _address(request)

        def handover(request_id: str, prompt_tokens: int) -> dict[str, Any]:
            return transfer.hand_over(request_id, prompt_tokens, host, port)

    if remote is None or not transfer.config.consumes:
        return handover, False, 0
    got = await transfer.pull(remote, inst.clock.speed)
    if isinstance(got, int):
        return handover, False, inst.receive_kv(hashes, got)
    return handover, transfer.config.kv_load_failure_policy == "fail", 0


async def kv_load_failed(
    request: web.Request, chat: bool, stream: bool, request_id: str, model: str
) -> web.StreamResponse:
    """vLLM's answer to a request whose KV load failed under ``kv_load_failure_policy: fail``: a
    plain request gets 500; a stream its opening (the role chunk, for chat) and an error event."""
    if not stream:
        return error_response(500, INTERNAL_ERROR, err_type="InternalServerError")
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    await resp.prepare(request)
    if chat:
        first = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        await resp.write(b"data: " + _encode(first) + b"\n\n")
    error = {"error": {"message": INTERNAL_ERROR, "type": "InternalServerError", "param": None, "code": 500}}
    await resp.write(b"data: " + _encode(error) + b"\n\ndata: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def kv_pull(request: web.Request) -> web.Response:
    """``POST /kv_transfer/pull``: a decode instance reads KV this instance holds for it."""
    inst = _instance(request)
    transfer = inst.kv_transfer
    if transfer is None:
        return web.json_response({"error": "this instance has no KV connector"}, status=404)
    if inst.faults.kv_lost:
        transfer.drop_all()
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError:
        body = None
    status, answer = transfer.serve_pull(body)
    return web.json_response(answer, status=status)
