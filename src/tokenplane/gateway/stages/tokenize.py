"""Tokenize: a chat or text prompt of a model with a tokenizer (``models[].tokenizer``) gets its
token ids (``ParsedRequest.token_ids``) and exact ``prompt_tokens``, so the describer can match it
against the engines' KV events block by block (:mod:`tokenplane.gateway.tokenization`). A prompt
that cannot be tokenized here keeps ``token_ids`` None: routed by the approximate index."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, cast

from tokenplane.gateway.request import ParsedRequest
from tokenplane.gateway.stages.context import RequestContext
from tokenplane.gateway.tokenization.config import Tokenizers

if TYPE_CHECKING:  # loaded with the first configured tokenizer, not with the gateway
    from tokenplane.gateway.tokenization.local import LocalTokenizer
    from tokenplane.gateway.tokenization.remote import RemoteTokenizer

log = logging.getLogger(__name__)


def _set(parsed: ParsedRequest, ids: Sequence[int] | None) -> None:
    if ids:
        parsed.token_ids = ids
        parsed.prompt_tokens = len(ids)


class Tokenize:
    __slots__ = ("failures", "tokenizers")

    def __init__(self, tokenizers: Tokenizers) -> None:
        self.tokenizers = tokenizers
        self.failures = 0

    def enter(self, ctx: RequestContext) -> Awaitable[None] | None:
        parsed, served = ctx.parsed, ctx.served
        if parsed is None or served is None or parsed.token_ids is not None:
            return None
        tok = self.tokenizers.get(served.name)
        if tok is None:
            return None
        chat = parsed.endpoint == "chat"
        if not chat and (parsed.endpoint != "completions" or type(parsed.body.get("prompt")) is not str):
            return None  # another route, or several prompts in one request
        if tok.source == "local":
            local = cast("LocalTokenizer", tok)
            try:
                if chat:
                    blocks = local.chat_blocks(parsed.body)
                    if blocks is not None and blocks.ids:
                        parsed.token_blocks = blocks
                        _set(parsed, blocks.ids)
                    return None
                ids = local.text(parsed.body["prompt"])
            except Exception:  # a tokenizer bug must not fail the request: route approximately
                self.failures += 1
                log.exception("tokenizing a %s prompt for %s failed", parsed.endpoint, served.name)
                return None
            _set(parsed, ids)
            return None
        return self._remote(cast("RemoteTokenizer", tok), parsed, chat)

    async def _remote(self, tok: RemoteTokenizer, parsed: ParsedRequest, chat: bool) -> None:
        _set(parsed, await tok.tokenize(parsed.body, chat))

    cleans_up = False

    def exit(self, ctx: RequestContext) -> None:
        pass
