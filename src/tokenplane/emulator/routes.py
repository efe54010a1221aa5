"""The emulator's routes other than serving: embeddings, models, health, metrics and the admin API,
and the OpenAI-style error body every route answers with.

``POST /v1/embeddings`` answers one deterministic vector per input (from its hash) without spending
engine time; ``GET|POST /admin/faults`` reads and merges fault injection (:mod:`.faults`);
``GET /admin/state`` is the engine's state for tests and demos.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import time
from typing import Any

import msgspec
from aiohttp import web
from pydantic import ValidationError

from tokenplane.core.prompt_hash import approx_tokens
from tokenplane.emulator.faults import FaultUpdate
from tokenplane.emulator.instance import EmulatedInstance
from tokenplane.emulator.metrics import CONTENT_TYPE
from tokenplane.emulator.protocol import format_validation_error

INSTANCE_KEY = web.AppKey("instance", EmulatedInstance)
RUNTIME_KEY = web.AppKey("runtime", str)

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "RequestTimeoutError",
    409: "ConflictError",
    413: "RequestEntityTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_response(
    status: int, message: str, param: str | None = None, err_type: str | None = None
) -> web.Response:
    """An OpenAI-style error body, as vLLM sends it."""
    body = {
        "error": {
            "message": message,
            "type": err_type
            or _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "APIError"),
            "param": param,
            "code": status,
        }
    }
    return web.Response(status=status, body=_json_encode(body), content_type="application/json")


def _instance(request: web.Request) -> EmulatedInstance:
    return request.app[INSTANCE_KEY]


# -- other routes ------------------------------------------------------------------------------------
EMBEDDING_DIMENSIONS = 8


def _embedding(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text`` (from its hash), so that tests can check it."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [digest[i % len(digest)] / 255.0 - 0.5 for i in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


async def embeddings(request: web.Request) -> web.Response:
    """``POST /v1/embeddings``: one deterministic vector per input text (no engine time spent)."""
    inst = _instance(request)
    try:
        body = _json_decode(await request.read())
    except msgspec.DecodeError as e:
        return error_response(400, f"JSON decode error: {e}")
    if not isinstance(body, dict):
        return error_response(400, "Request body must be a JSON object.")
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given if isinstance(given, list) else None
    if not texts or not all(isinstance(t, str) for t in texts):
        return error_response(400, "'input' must be a string or a non-empty array of strings.", "input")
    dims = body.get("dimensions")
    dims = dims if isinstance(dims, int) and 0 < dims <= 4096 else EMBEDDING_DIMENSIONS
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for i, text in enumerate(texts):
        vec = _embedding(text, dims)
        out: Any = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode() if as_base64 else vec
        data.append({"object": "embedding", "index": i, "embedding": out})
    tokens = sum(approx_tokens(t) for t in texts)
    answer = {
        "object": "list",
        "data": data,
        "model": inst.settings.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return web.Response(body=_json_encode(answer), content_type="application/json")


async def models(request: web.Request) -> web.Response:
    inst = _instance(request)
    s = inst.settings
    body = {
        "object": "list",
        "data": [
            {
                "id": s.model_name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": inst.model_spec_name,
                "parent": None,
                "max_model_len": inst.max_model_len,
                "permission": [],
            }
        ],
    }
    return web.Response(body=_json_encode(body), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    if _instance(request).faults.unhealthy:
        return web.Response(status=503)
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    inst = _instance(request)
    inst.refresh_gauges()
    body = inst.metrics.render(request.app[RUNTIME_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def get_faults(request: web.Request) -> web.Response:
    return web.json_response(_instance(request).faults.as_dict())


async def post_faults(request: web.Request) -> web.Response:
    inst = _instance(request)
    try:
        body = _json_decode(await request.read())
    except msgspec.DecodeError as e:
        return error_response(400, f"JSON decode error: {e}")
    if not isinstance(body, dict):
        return error_response(400, "Request body must be a JSON object.")
    try:
        update = FaultUpdate.model_validate(body)
    except ValidationError as e:
        msg, param = format_validation_error(e)
        return error_response(400, msg, param)
    inst.faults.apply(update)
    inst.set_slow_factor(inst.faults.slow_factor)
    return web.json_response(inst.faults.as_dict())


async def state(request: web.Request) -> web.Response:
    return web.json_response(_instance(request).state())
