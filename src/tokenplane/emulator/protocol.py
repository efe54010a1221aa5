"""The OpenAI request shapes the emulator accepts, validated as vLLM does (pydantic, extra allowed).

Prompts are rendered and counted exactly as the gateway does (``core.prompt_hash``), so the two
agree on prefix blocks: chat messages through :func:`render_chat`, plain text as given, token-id
prompts as four characters per id (:func:`render_token_ids`), so one id is one approximate token.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokenplane.core.prompt_hash import render_chat

GENERATION_PROMPT = "<|assistant|>\n"

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

_LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore "
    "et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris nisi aliquip "
    "ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse cillum fugiat nulla "
    "pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui officia deserunt mollit anim "
    "id est laborum"
)
WORDS = tuple(_LOREM.split())


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    ignore_eos: bool | None = False
    min_tokens: int | None = Field(default=None, ge=0)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError("the emulator generates exactly one choice (n must be 1)")
        return v


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be empty")
            if isinstance(v[0], (str, list)) and len(v) != 1:
                raise ValueError("the emulator serves one prompt per request")
        return v


Kind = Literal["chat", "completion"]


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def format_validation_error(err: ValidationError) -> tuple[str, str | None]:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    msg = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg', 'invalid')}"
        for e in err.errors()
    )
    return msg, (loc or None)


def render_token_ids(ids: list[int]) -> str:
    """Four characters per token id (base 64, so 16.7 M distinct ids), so one id is one token."""
    out = []
    for i in ids:
        i &= 0xFFFFFF
        out.append(_B64[(i >> 18) & 63] + _B64[(i >> 12) & 63] + _B64[(i >> 6) & 63] + _B64[i & 63])
    return "".join(out)


def render_chat_request(req: ChatCompletionRequest) -> str:
    """The prompt as the emulated model sees it; the gateway's ``render_chat`` is its prefix."""
    if (
        req.continue_final_message
        and req.add_generation_prompt
        and "add_generation_prompt" in (req.model_fields_set)
    ):
        raise BadRequest(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    messages = [m.model_dump() for m in req.messages]
    text = render_chat(messages)
    if req.continue_final_message:
        if req.messages[-1].role != "assistant":
            raise BadRequest(
                "continue_final_message requires the last message to be from the assistant",
                "continue_final_message",
            )
        return text[:-1]  # drop the turn's closing newline: the assistant message goes on
    if req.add_generation_prompt:
        text += GENERATION_PROMPT
    return text


def render_completion_request(req: CompletionRequest) -> str:
    p = req.prompt
    if isinstance(p, str):
        return p
    first = p[0]
    if isinstance(first, str):
        return first
    if isinstance(first, list):
        return render_token_ids(first)
    return render_token_ids(p)  # type: ignore[arg-type]


class TextGen:
    """Deterministic pseudo-words, one per token: `` lorem``, `` ipsum``, ..."""

    __slots__ = ("_rng",)

    def __init__(self, seed: int | str) -> None:
        if isinstance(seed, str):
            seed = int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest(), "big")
        self._rng = random.Random(seed)

    def word(self) -> str:
        return " " + WORDS[self._rng.randrange(len(WORDS))]

    def words(self, n: int) -> list[str]:
        return [self.word() for _ in range(n)]
