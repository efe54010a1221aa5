"""Parse and validate one OpenAI API request body, once, into a :class:`ParsedRequest`.

The gateway checks what it needs to route and account (``model``, the prompt, ``max_tokens``,
``stream``) and the types of the common sampling parameters, so a bad request is refused at the
edge with a precise error rather than by an instance after routing. Parameters it does not know are
passed through untouched: runtimes accept extensions (vLLM's ``top_k``, ``min_p``...) and judge them.

Cost: one ``msgspec`` decode of the body (about 1 µs per KB), a handful of type checks, and one
rendering of the prompt (chat messages rendered canonically by :func:`render_chat`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from tokenplane.core.prompt_hash import approx_tokens, render_chat
from tokenplane.gateway.config import LimitsConfig
from tokenplane.gateway.errors import (
    ContextLengthExceeded,
    InvalidParameter,
    InvalidRequest,
    MalformedJSON,
)

if TYPE_CHECKING:
    from tokenplane.gateway.token_blocks import TokenBlocks

Endpoint = Literal["chat", "completions", "other"]
"""The two completion routes, parsed in full; "other": any other ``POST /v1/*`` route passed through
(:func:`parse_other`)."""

ASSUMED_OUTPUT_TOKENS = 256
"""Output tokens assumed for accounting when a request gives no ``max_tokens`` (not a limit)."""

MAX_N = 128

_decode = msgspec.json.Decoder().decode


class ParsedRequest(msgspec.Struct):
    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    prompt_text: str
    prompt_tokens: int
    max_tokens: int | None
    token_ids: Sequence[int] | None = None
    """The prompt's token ids when the client sent them (a completions ``prompt`` of ids), or from
    the model's tokenizer (a ``list`` or an ``array('i')``)."""
    token_blocks: TokenBlocks | None = None
    """From the model's tokenizer: ``token_ids`` with their block keys, hashed once per request."""


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(v), type(v).__name__)


def _bad(param: str, expected: str, value: Any) -> InvalidParameter:
    return InvalidParameter(f"'{param}' must be {expected}, got {_type_name(value)}", param=param)


def _number(lo: float, hi: float) -> Callable[[str, Any], None]:
    def check(name: str, v: Any) -> None:
        if not _is_number(v):
            raise _bad(name, "a number", v)
        if not lo <= v <= hi:
            raise InvalidParameter(f"'{name}' must be between {lo:g} and {hi:g}, got {v}", param=name)

    return check


def _integer(lo: int, hi: int | None = None) -> Callable[[str, Any], None]:
    def check(name: str, v: Any) -> None:
        if not _is_int(v):
            raise _bad(name, "an integer", v)
        if v < lo or (hi is not None and v > hi):
            bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
            raise InvalidParameter(f"'{name}' must be {bound}, got {v}", param=name, code="invalid_value")

    return check


def _boolean(name: str, v: Any) -> None:
    if type(v) is not bool:
        raise _bad(name, "a boolean", v)


def _string(name: str, v: Any) -> None:
    if type(v) is not str:
        raise _bad(name, "a string", v)


def _stop(name: str, v: Any) -> None:
    if type(v) is str:
        return
    if type(v) is not list or not all(type(s) is str for s in v):
        raise _bad(name, "a string or an array of strings", v)


def _stream_options(name: str, v: Any) -> None:
    if type(v) is not dict:
        raise _bad(name, "an object", v)
    usage = v.get("include_usage")
    if usage is not None and type(usage) is not bool:
        raise _bad("stream_options.include_usage", "a boolean", usage)


# Optional parameters whose types the gateway checks; null is always accepted (OpenAI's default).
_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "stream": _boolean,
    "temperature": _number(0.0, 2.0),
    "top_p": _number(0.0, 1.0),
    "presence_penalty": _number(-2.0, 2.0),
    "frequency_penalty": _number(-2.0, 2.0),
    "n": _integer(1, MAX_N),
    "seed": _integer(-(2**63), 2**64 - 1),
    "stop": _stop,
    "user": _string,
    "stream_options": _stream_options,
    "max_tokens": _integer(1),
    "max_completion_tokens": _integer(1),
}


def _messages_text(messages: Any) -> str:
    if type(messages) is not list:
        raise _bad("messages", "an array", messages)
    if not messages:
        raise InvalidParameter("'messages' must contain at least one message", param="messages")
    for i, m in enumerate(messages):
        if type(m) is not dict:
            raise _bad(f"messages[{i}]", "an object", m)
        role = m.get("role")
        if type(role) is not str:
            raise _bad(f"messages[{i}].role", "a string", role)
        content = m.get("content")
        if content is None or type(content) is str:
            continue
        if type(content) is not list:
            raise _bad(f"messages[{i}].content", "a string, an array of parts or null", content)
        for j, part in enumerate(content):
            if type(part) is not dict or type(part.get("type")) is not str:
                raise _bad(f"messages[{i}].content[{j}]", "an object with a string 'type'", part)
    return render_chat(messages)


def _prompt(prompt: Any) -> tuple[str, int, list[int] | None]:
    """(text to hash, prompt tokens, the token ids when the prompt is one list of them) for a
    completions prompt: text, texts, token ids or id lists."""
    if type(prompt) is str:
        return prompt, approx_tokens(prompt), None
    if type(prompt) is list and prompt:
        if all(type(p) is str for p in prompt):
            text = "\n".join(prompt)
            return text, sum(approx_tokens(p) for p in prompt), None
        if all(_is_int(t) for t in prompt):
            return " ".join(map(str, prompt)), len(prompt), prompt
        if all(type(p) is list and p and all(_is_int(t) for t in p) for p in prompt):
            return " ".join(map(str, prompt[0])), sum(len(p) for p in prompt), None
    raise InvalidParameter(
        "'prompt' must be a string, a non-empty array of strings, of token ids, or of token-id arrays",
        param="prompt",
    )


def _object_naming_a_model(raw: bytes) -> tuple[dict[str, Any], str]:
    """The body as a JSON object and the non-empty ``model`` it names, or the precise error."""
    if not raw:
        raise MalformedJSON("the request body is empty; expected a JSON object")
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        raise MalformedJSON(f"the request body is not valid JSON: {exc}") from None
    if type(body) is not dict:
        raise MalformedJSON(f"the request body must be a JSON object, got {_type_name(body)}")
    model = body.get("model")
    if model is None:
        raise InvalidParameter("'model' is required", param="model", code="missing_required_parameter")
    if type(model) is not str or not model:
        raise _bad("model", "a non-empty string", model)
    return body, model


def parse_request(raw: bytes, endpoint: Endpoint, limits: LimitsConfig) -> ParsedRequest:
    """Decode and validate a body; raises an :class:`InvalidRequest` subclass naming the parameter."""
    body, model = _object_naming_a_model(raw)
    checks = _CHECKS
    for name, v in body.items():  # a body names a few of the checked parameters: walk the body
        if v is not None and (check := checks.get(name)) is not None:
            check(name, v)
    stream = body.get("stream") is True
    if body.get("stream_options") is not None and not stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    if endpoint == "chat":
        if "messages" not in body:
            raise InvalidParameter(
                "'messages' is required", param="messages", code="missing_required_parameter"
            )
        text = _messages_text(body["messages"])
        prompt_tokens = approx_tokens(text)
        token_ids = None
        prompt_param = "messages"
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
    else:
        if "prompt" not in body:
            raise InvalidParameter("'prompt' is required", param="prompt", code="missing_required_parameter")
        text, prompt_tokens, token_ids = _prompt(body["prompt"])
        prompt_param = "prompt"
        max_tokens = body.get("max_tokens")
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise ContextLengthExceeded(
            f"max_tokens is {max_tokens}; this gateway allows at most {limits.max_tokens}",
            param="max_tokens",
        )
    if prompt_tokens > limits.max_prompt_tokens:
        raise ContextLengthExceeded(
            f"the prompt is about {prompt_tokens} tokens; this gateway allows at most "
            f"{limits.max_prompt_tokens}",
            param=prompt_param,
        )
    return ParsedRequest(endpoint, body, model, stream, text, prompt_tokens, max_tokens, token_ids)


def parse_other(raw: bytes, limits: LimitsConfig) -> ParsedRequest:
    """A body for another ``/v1/*`` route (embeddings, rerank, score...): a JSON object naming its
    ``model``; the rest is the runtime's to judge. Its prompt is not hashed (no prefix routing);
    its tokens are estimated from a text ``input`` for accounting."""
    body, model = _object_naming_a_model(raw)
    given = body.get("input")
    texts = [given] if type(given) is str else given if type(given) is list else []
    tokens = sum(approx_tokens(t) for t in texts if type(t) is str)
    if tokens > limits.max_prompt_tokens:
        raise ContextLengthExceeded(
            f"the input is about {tokens} tokens; this gateway allows at most {limits.max_prompt_tokens}",
            param="input",
        )
    return ParsedRequest("other", body, model, False, "", tokens, None)
