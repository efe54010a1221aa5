"""The instances' own tokenizer, through vLLM's ``POST /tokenize`` (one round trip per request).

The body is the request's own prompt: ``messages`` (with ``add_generation_prompt``,
``continue_final_message``, ``tools``, ``chat_template_kwargs``; ``add_special_tokens`` false, as
vLLM's chat route does) or ``prompt`` (``add_special_tokens`` true, as its completions route
does); the answer's ``tokens`` are what that instance's engine will see. Instances of the model
are asked in turn (rotating the first), each within ``timeout_s``; when none answers, the request
is routed by the approximate index.

Cache: vLLM renders the whole conversation, so only an identical prompt can be reused: answers
are kept per prompt digest, ``cache_entries`` of them, least recently used dropped first. A
growing conversation costs one round trip per turn; prefer the local tokenizer where the folder
is at hand.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import msgspec

from tokenplane.gateway.tokenization.prefix_cache import DEFAULT_CACHE_ENTRIES

log = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode
_CHAT_FIELDS = ("add_generation_prompt", "continue_final_message", "tools", "chat_template_kwargs")


class _Tokens(msgspec.Struct):
    tokens: list[int]


_decode_tokens = msgspec.json.Decoder(_Tokens).decode


class RemoteTokenizer:
    source = "remote"

    def __init__(
        self,
        urls: Sequence[str],
        served_model: str,
        session: Callable[[], aiohttp.ClientSession | None],
        *,
        timeout_s: float = 1.0,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
    ) -> None:
        self.urls = [u.rstrip("/") + "/tokenize" for u in urls]
        self.served_model = served_model
        self._session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.cache_entries = cache_entries
        self._cache: OrderedDict[int, list[int]] = OrderedDict()
        self._turn = itertools.count()
        self.failures = 0
        self.hits = 0

    def _body(self, body: Mapping[str, Any], chat: bool) -> bytes:
        out: dict[str, Any] = {"model": self.served_model}
        if chat:
            out["messages"] = body["messages"]
            for name in _CHAT_FIELDS:
                if body.get(name) is not None:
                    out[name] = body[name]
            out["add_special_tokens"] = False
        else:
            out["prompt"] = body["prompt"]
            out["add_special_tokens"] = True
        return _encode(out)

    async def tokenize(self, body: Mapping[str, Any], chat: bool) -> list[int] | None:
        payload = self._body(body, chat)
        key = hash(payload)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return cached
        session = self._session()
        if session is None or not self.urls:
            return None
        n = len(self.urls)
        first = next(self._turn) % n
        for i in range(n):
            url = self.urls[(first + i) % n]
            try:
                async with session.post(
                    url, data=payload, headers={"Content-Type": "application/json"}, timeout=self.timeout
                ) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        self.failures += 1
                        continue
                ids = _decode_tokens(raw).tokens
            except (TimeoutError, aiohttp.ClientError, msgspec.DecodeError) as exc:
                self.failures += 1
                log.debug("tokenize at %s failed: %s", url, exc)
                continue
            if self.cache_entries:
                self._cache[key] = ids
                while len(self._cache) > self.cache_entries:
                    self._cache.popitem(last=False)
            return ids
        return None
