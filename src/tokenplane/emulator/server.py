"""The emulator's HTTP face: vLLM's OpenAI-compatible API, ``/metrics`` and a fault-injection admin API.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (stream or not, with
``stream_options.include_usage`` / ``continuous_usage_stats``), ``POST /v1/embeddings`` (one
deterministic vector per input, from its hash), ``GET /v1/models``, ``GET /health``,
``GET /metrics``, ``GET|POST /admin/faults``, ``GET /admin/state``, and with a KV connector
(``--kv-transfer-config``) the prefill and decode roles of P/D disaggregation and their side channel
``POST /kv_transfer/pull`` (:mod:`.kv_transfer`, :mod:`.disagg_serving`).

Streams carry one SSE event per generated token, written as the engine produces them (several per
write when the handler falls behind). A client that goes away aborts its request in the engine (the
runner must be started with ``handler_cancellation=True``, as :func:`start_emulator` and the CLI do,
for non-streamed requests to notice).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from aiohttp import web
from pydantic import ValidationError

from tokenplane.core.prompt_hash import approx_tokens, block_hashes
from tokenplane.emulator.disagg_serving import Handover, connector_step, kv_load_failed, kv_pull
from tokenplane.emulator.faults import DieFault
from tokenplane.emulator.instance import BLOCK_TOKENS, EmulatedInstance, EmulatorSettings, Pending
from tokenplane.emulator.kv_events import TOKENIZATION_KEY, EmulatedTokenization, run_publisher, tokenize
from tokenplane.emulator.kv_transfer import PULL_PATH, KvParamsError
from tokenplane.emulator.metrics import RUNTIME_FLAVOURS
from tokenplane.emulator.protocol import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    TextGen,
    format_validation_error,
    render_chat_request,
    render_completion_request,
)
from tokenplane.emulator.routes import (
    EMBEDDING_DIMENSIONS as EMBEDDING_DIMENSIONS,  # re-exported (tests)
)
from tokenplane.emulator.routes import (
    INSTANCE_KEY,
    RUNTIME_KEY,
    _instance,
    embeddings,
    error_response,
    get_faults,
    health,
    metrics,
    models,
    post_faults,
    state,
)
from tokenplane.emulator.routes import (
    _embedding as _embedding,
)

SETTINGS_KEY = web.AppKey("settings", EmulatorSettings)

MAX_BODY_BYTES = 64 * 1024 * 1024
_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode
_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


# -- serving API -----------------------------------------------------------------------------------
async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, chat=False)


async def _serve(request: web.Request, chat: bool) -> web.StreamResponse:
    inst = _instance(request)
    faults = inst.faults
    status = faults.take_error()
    if status is not None:
        return error_response(status, f"Injected fault: this instance answers {status}.")
    if faults.take_hang():
        await asyncio.Event().wait()  # until the client goes away (the handler is cancelled)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"Request body exceeds {MAX_BODY_BYTES} bytes.")
    try:
        body = _json_decode(raw)
    except msgspec.DecodeError as e:
        return error_response(400, f"JSON decode error: {e}")
    if not isinstance(body, dict):
        return error_response(400, "Request body must be a JSON object.")
    try:
        req: ChatCompletionRequest | CompletionRequest
        if chat:
            req = ChatCompletionRequest.model_validate(body)
            text = render_chat_request(req)
            requested = req.max_completion_tokens or req.max_tokens
        else:
            req = CompletionRequest.model_validate(body)
            text = render_completion_request(req)
            requested = req.max_tokens
    except ValidationError as e:
        msg, param = format_validation_error(e)
        return error_response(400, msg, param)
    except BadRequest as e:
        return error_response(400, e.message, e.param)
    settings = inst.settings
    adapter = req.model if req.model in settings.lora_modules else None
    if req.model != settings.model_name and adapter is None:
        return error_response(404, f"The model `{req.model}` does not exist.", "model", "NotFoundError")

    tok = request.app.get(TOKENIZATION_KEY)
    ids = tok.ids(body, chat) if tok is not None else None
    prompt_tokens = approx_tokens(text) if ids is None else len(ids)
    if requested is None:
        output_tokens = min(settings.default_max_tokens, max(1, inst.max_model_len - prompt_tokens))
        finish_reason = "stop"
    elif requested > settings.max_tokens_cap and not req.ignore_eos:
        output_tokens, finish_reason = settings.max_tokens_cap, "stop"  # the "model" stops early
    else:
        output_tokens, finish_reason = requested, "length"
    if not inst.fits(prompt_tokens, requested or output_tokens):
        total = prompt_tokens + (requested or output_tokens)
        return error_response(
            400,
            f"This model's maximum context length is {inst.max_model_len} tokens. However, you requested "
            f"{total} tokens ({prompt_tokens} in the messages, {requested or output_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            "max_tokens",
        )

    request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    seed: int | str = req.seed if req.seed is not None else f"{settings.seed}\0{text}"
    gen = TextGen(seed)
    hashes: tuple[int, ...] = ()
    if settings.enable_prefix_caching:
        hashes = block_hashes(text, BLOCK_TOKENS) if ids is None or tok is None else tok.blocks(ids)
    handover: Handover | None = None
    pulled = 0
    kv_params = body.get("kv_transfer_params")
    if kv_params is not None and inst.kv_transfer is not None:  # without a connector vLLM ignores them
        try:
            step = await connector_step(request, inst, kv_params, hashes, bool(req.stream))
        except KvParamsError as e:
            return error_response(400, e.message, e.param)
        handover, failed, pulled = step
        if failed:
            return await kv_load_failed(request, chat, bool(req.stream), request_id, settings.model_name)
    die = faults.take_die()
    pending = inst.submit(request_id, prompt_tokens, hashes, output_tokens, finish_reason, adapter, pulled)
    try:
        if req.stream:
            opts = req.stream_options
            return await _stream(
                request,
                inst,
                pending,
                gen,
                chat,
                include_usage=bool(opts and opts.include_usage),
                continuous_usage=bool(opts and opts.continuous_usage_stats),
                die=die,
            )
        return await _complete(request, inst, pending, gen, chat, die, _echo(req, text), handover)
    finally:
        inst.abort(pending)  # no-op when it finished


def _echo(req: ChatCompletionRequest | CompletionRequest, text: str) -> str:
    if isinstance(req, CompletionRequest) and req.echo and isinstance(req.prompt, str):
        return text
    return ""


def _usage(p: Pending) -> dict[str, Any]:
    return {
        "prompt_tokens": p.prompt_tokens,
        "total_tokens": p.prompt_tokens + p.n,
        "completion_tokens": p.n,
        "prompt_tokens_details": {"cached_tokens": p.cached_tokens},
    }


async def _cut(request: web.Request, inst: EmulatedInstance, pending: Pending, die: DieFault) -> None:
    """The die fault: drop the connection mid-answer (or the whole process) without a final chunk,
    or (``stall``) send nothing more and hold the connection until the client gives up."""
    if die.exit_process:
        os._exit(17)
    if die.stall:
        try:
            await asyncio.Event().wait()  # until the client goes away (the handler is cancelled)
        finally:
            inst.abort(pending)
    inst.abort(pending)
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # flushes what was sent, then FIN; nothing else follows
        transport.abort()
    raise asyncio.CancelledError  # aiohttp drops the request quietly


async def _complete(
    request: web.Request,
    inst: EmulatedInstance,
    pending: Pending,
    gen: TextGen,
    chat: bool,
    die: DieFault | None,
    echo_text: str,
    handover: Handover | None = None,
) -> web.StreamResponse:
    while not pending.finished:
        if die is not None and pending.n >= die.tokens:
            await _cut(request, inst, pending, die)
        await pending.wait()
    if die is not None and pending.n >= die.tokens:
        await _cut(request, inst, pending, die)
    text = "".join(gen.words(pending.n))
    created = int(time.time())
    model = inst.settings.model_name
    choice: dict[str, Any]
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": pending.finish_reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": echo_text + text,
            "logprobs": None,
            "finish_reason": pending.finish_reason,
            "stop_reason": None,
        }
        obj = "text_completion"
    body = {
        "id": pending.request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(pending),
        "kv_transfer_params": handover(pending.request_id, pending.prompt_tokens) if handover else None,
    }
    resp = web.Response(body=_json_encode(body), content_type="application/json")
    if handover is not None and inst.faults.exit_after_handover:
        await resp.prepare(request)
        await resp.write_eof()
        os._exit(17)  # the prefill process dies with the KV it just handed over
    return resp


async def _stream(
    request: web.Request,
    inst: EmulatedInstance,
    pending: Pending,
    gen: TextGen,
    chat: bool,
    *,
    include_usage: bool,
    continuous_usage: bool,
    die: DieFault | None,
) -> web.StreamResponse:
    resp = web.StreamResponse(headers=_SSE_HEADERS)
    await resp.prepare(request)
    created = int(time.time())
    model = inst.settings.model_name
    head: dict[str, Any] = {
        "id": pending.request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
    }

    def event(obj: dict[str, Any]) -> bytes:
        return b"data: " + _json_encode(obj) + b"\n\n"

    def chunk(word: str, finish: str | None) -> bytes:
        if chat:
            c: dict[str, Any] = {
                "index": 0,
                "delta": {"content": word},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            c = {"index": 0, "text": word, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            c["stop_reason"] = None
        obj: dict[str, Any] = {**head, "choices": [c]}
        if continuous_usage:
            obj["usage"] = _usage(pending)
        return event(obj)

    # The happy path formats a token chunk by splicing the word between two fixed byte strings.
    proto = chunk("\x00", None)
    pre, _, post = proto.partition(b"\\u0000")
    fast = not continuous_usage and bool(pre) and bool(post)

    if chat:
        first: dict[str, Any] = {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
    # As vLLM: the role chunk goes out with the first token (a queued or prefilling request is silent).
    role = event(first) if chat else b""
    sent = 0
    limit = die.tokens if die is not None else None
    while True:
        n = pending.n
        if limit is not None and n > limit:
            n = limit
        if n > sent:
            parts = [role] if role else []
            role = b""
            for i in range(sent, n):
                word = gen.word()
                if pending.finished and i == pending.n - 1 and pending.finish_reason != "abort":
                    parts.append(chunk(word, pending.finish_reason))
                elif fast:
                    parts.append(pre + word.encode() + post)
                else:
                    parts.append(chunk(word, None))
            sent = n
            await resp.write(b"".join(parts))
        if die is not None and sent >= die.tokens:
            await _cut(request, inst, pending, die)
        if pending.finished and sent >= pending.n:
            break
        await pending.wait()
    if include_usage:
        await resp.write(event({**head, "choices": [], "usage": _usage(pending)}))
    await resp.write(_DONE)
    await resp.write_eof()
    return resp


# -- app -----------------------------------------------------------------------------------------
def create_app(settings: EmulatorSettings, runtime: str = "vllm") -> web.Application:
    """The emulator's aiohttp application; the instance (engine and clock) starts with the app.
    ``runtime``: whose metric names ``/metrics`` speaks (``vllm``, ``sglang``, ``llamacpp``)."""
    if runtime not in RUNTIME_FLAVOURS:
        raise ValueError(f"unknown runtime flavour {runtime!r}; known: {', '.join(RUNTIME_FLAVOURS)}")
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SETTINGS_KEY] = settings
    app[RUNTIME_KEY] = runtime

    async def instance_ctx(app: web.Application) -> AsyncIterator[None]:
        app[INSTANCE_KEY] = inst = EmulatedInstance(settings)
        yield
        if inst.kv_transfer is not None:
            await inst.kv_transfer.close()

    app.cleanup_ctx.append(instance_ctx)
    if settings.tokenizer or settings.kv_events_endpoint:
        app[TOKENIZATION_KEY] = EmulatedTokenization(settings.tokenizer, settings.kv_events_endpoint)
        app.cleanup_ctx.append(lambda a: run_publisher(a, a[INSTANCE_KEY].engine))
        if settings.tokenizer:
            app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/faults", get_faults)
    app.router.add_post("/admin/faults", post_faults)
    app.router.add_get("/admin/state", state)
    app.router.add_post(PULL_PATH, kv_pull)  # the KV connector's side channel (P/D)
    return app


async def start_emulator(
    settings: EmulatorSettings, port: int = 0, host: str = "127.0.0.1", runtime: str = "vllm"
) -> tuple[web.AppRunner, str]:
    """Serve an emulator in the current loop; ``port=0`` picks a free port. Returns ``(runner, url)``.

    Stop it with ``await runner.cleanup()``.
    """
    runner = web.AppRunner(create_app(settings, runtime), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    for addr in runner.addresses:
        if isinstance(addr, tuple):
            bound = int(addr[1])
            break
    return runner, f"http://{host}:{bound}"


def instance_of(app: web.Application) -> EmulatedInstance:
    """The running instance of an app made by :func:`create_app` (after startup)."""
    return app[INSTANCE_KEY]
