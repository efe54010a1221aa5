"""The model's own tokenizer, loaded from a local folder: ``tokenizer.json`` (the ``tokenizers``
library) and the chat template (``chat_template.jinja`` or ``tokenizer_config.json``).

Chat requests are rendered with the template (:mod:`.chat_template`) and tokenized without adding
special tokens, as vLLM does for ``/v1/chat/completions`` (the template writes its own BOS); text
prompts (``/v1/completions``) with them, as vLLM does there. A growing conversation reuses the ids
of its previous turn from :class:`~.prefix_cache.PrefixCache`.

How it fails: a conversation the gateway cannot render the way the engine will (image parts, a
``chat_template`` in the request, a template error) gives ``None``: that request is routed by the
approximate index, with its reason.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
from tokenizers import Tokenizer

from tokenplane.gateway.errors import ConfigError
from tokenplane.gateway.token_blocks import TokenBlocks
from tokenplane.gateway.tokenization.chat_template import ChatTemplate, SplitTemplate, TemplateError
from tokenplane.gateway.tokenization.encoder import EncoderChoice, NotExact, load_encoder
from tokenplane.gateway.tokenization.prefix_cache import (
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_CACHE_TOKENS,
    CachedPrefix,
    PrefixCache,
)

_encode_json = msgspec.json.Encoder().encode
_ENDS_MAX = 256
"""Rendering options remembered with their head and tail (a split template); all dropped when full."""


def _text_content(message: Any) -> Mapping[str, Any] | None:
    """The message as the template sees it: text parts joined with newlines (vLLM's "string"
    content format); ``None`` for a part that is not text (images, audio)."""
    if type(message) is not dict:
        return None
    content = message.get("content")
    if content is None or type(content) is str:
        return message
    if type(content) is not list:
        return None
    texts: list[str] = []
    for part in content:
        if type(part) is not dict or part.get("type") != "text" or type(part.get("text")) is not str:
            return None
        texts.append(part["text"])
    return {**message, "content": "\n".join(texts)}


def _message_digest(parent: int, message: dict[str, Any]) -> int:
    """The digest of the messages up to ``message`` (``parent``: of those before it). A message of
    strings (role, content, name: the usual one) is hashed as its items, the strings' own hashes,
    without writing it as JSON first; any other value (a list of parts, a number, None) makes it
    hashed as its JSON text (``1``, ``1.0`` and ``True`` hash alike in Python, not as JSON)."""
    for value in message.values():
        if type(value) is not str:
            return hash((parent, _encode_json(message)))
    return hash((parent, tuple(message.items())))


class LocalTokenizer:
    source = "local"

    def __init__(
        self,
        folder: str | Path,
        *,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
        encoder: EncoderChoice = "auto",
    ) -> None:
        path = Path(folder)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ConfigError(f"tokenizer: {tokenizer_file} does not exist")
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:
            raise ConfigError(f"tokenizer: {tokenizer_file} could not be loaded: {exc}") from None
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        # fastokens, else tiktoken, where exact for this tokenizer (checked now), else tokenizers
        try:
            self.encoder, self.encoder_reason = load_encoder(self.tokenizer, tokenizer_file, encoder)
        except NotExact as exc:
            raise ConfigError(f"tokenizer: {tokenizer_file}: encoder: {encoder} is not exact: {exc}") from exc
        self._encode = self.encoder.encode
        config: dict[str, Any] = {}
        config_file = path / "tokenizer_config.json"
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise ConfigError(f"tokenizer: {config_file} is not JSON: {exc}") from None
        self.template = ChatTemplate.from_folder(path, config)
        self.added_ids = frozenset(self.tokenizer.get_added_tokens_decoder())
        self.cache = PrefixCache(cache_entries, cache_tokens)
        # per rendering options (the root digest): the variables, head and tail of a split template
        self._ends: dict[int, tuple[dict[str, Any], str, str]] = {}

    # -- text prompts ----------------------------------------------------------------------------
    def text(self, prompt: str) -> list[int]:
        return self.encoder.encode_text(prompt)

    # -- chat ------------------------------------------------------------------------------------
    def render(self, messages: Sequence[Mapping[str, Any]], body: Mapping[str, Any]) -> str | None:
        template = self.template
        if template is None or body.get("chat_template") is not None:
            return None
        kwargs = body.get("chat_template_kwargs")
        try:
            return template.render(
                messages,
                add_generation_prompt=body.get("add_generation_prompt", True) is not False,
                continue_final_message=body.get("continue_final_message") is True,
                tools=body.get("tools"),
                documents=body.get("documents"),
                extra=kwargs if type(kwargs) is dict else None,
            )
        except TemplateError:
            return None

    def chat(self, body: Mapping[str, Any]) -> Sequence[int] | None:
        """The token ids vLLM will see for this chat request, or ``None`` (not renderable here)."""
        blocks = self.chat_blocks(body)
        return None if blocks is None else blocks.ids

    def chat_blocks(self, body: Mapping[str, Any]) -> TokenBlocks | None:
        """:meth:`chat`'s ids with their block keys, which go on from the cached prefix's."""
        raw = body.get("messages")
        template = self.template
        if type(raw) is not list or not raw or template is None or body.get("chat_template") is not None:
            return None
        # digest_k names messages 0..k-1 (as sent) and everything else the template is rendered
        # with, so that a hit on the split path needs no second look at the prefix
        digest: int = hash(
            _encode_json(
                [
                    body.get("add_generation_prompt", True),
                    body.get("continue_final_message"),
                    body.get("tools"),
                    body.get("documents"),
                    body.get("chat_template_kwargs"),
                ]
            )
        )
        root = digest
        digests: list[int] = []
        for m in raw:
            if type(m) is not dict:
                return None
            digest = _message_digest(digest, m)
            digests.append(digest)
        if template.split is not None and body.get("continue_final_message") is not True:
            ids = self._chat_split(template.split, template, raw, root, digests, body)
            if ids is not False:
                return ids
        return self._chat_whole(raw, digests, body)

    def _chat_split(
        self,
        split: SplitTemplate,
        template: ChatTemplate,
        raw: list[Any],
        root: int,
        digests: list[int],
        body: Mapping[str, Any],
    ) -> TokenBlocks | Literal[False] | None:
        """Render and tokenize only the messages after the longest cached prefix (``False``: the
        cached prefix did not fit, do it whole)."""
        cache = self.cache
        for k in range(len(digests), 0, -1):
            base = cache.get(digests[k - 1])
            if base is not None:
                break
        else:
            k, base = 0, None
        messages: list[Mapping[str, Any]] = []
        for m in raw[k:]:  # the prefix's messages were renderable when it was stored
            tm = _text_content(m)
            if tm is None:
                return None
            messages.append(tm)
        ends = self._ends.get(root)
        try:
            if ends is None:  # what the template is rendered with, its head and its tail
                kwargs = body.get("chat_template_kwargs")
                variables = template.variables(
                    body.get("add_generation_prompt", True) is not False,
                    body.get("tools"),
                    body.get("documents"),
                    kwargs if type(kwargs) is dict else None,
                )
                ends = (variables, split.head(variables), split.tail(variables))
                if len(self._ends) >= _ENDS_MAX:
                    self._ends.clear()
                self._ends[root] = ends
            variables, head, tail = ends
            text = (base.rest if base is not None else head) + split.messages(messages, variables)
        except TemplateError:
            return None
        done = self._extend(text + tail, base, len(text))
        if done is None:
            return False
        blocks, entry = done
        if entry is not None:
            cache.put(digests[-1], entry)
        return blocks

    def _chat_whole(self, raw: list[Any], digests: list[int], body: Mapping[str, Any]) -> TokenBlocks | None:
        """Render the whole conversation; tokenize it after the longest cached prefix of its text."""
        messages: list[Mapping[str, Any]] = []
        for m in raw:
            tm = _text_content(m)
            if tm is None:
                return None
            messages.append(tm)
        rendered = self.render(messages, body)
        if rendered is None:
            return None
        cache = self.cache
        base: CachedPrefix | None = None
        for k in range(len(digests) - 1, -1, -1):
            entry = cache.get(digests[k])
            if entry is not None and entry.text and rendered.startswith(entry.text):
                base = entry
                break
        start = len(base.text) if base is not None else 0
        done = self._extend(rendered[start:], base, len(rendered) - start)
        if done is None:
            done = self._extend(rendered, None, len(rendered))
            assert done is not None
        blocks, new = done
        if new is not None:
            new.text = rendered[: len(rendered) - len(new.rest)]
            cache.put(digests[-1], new)
        return blocks

    def _extend(
        self, text: str, base: CachedPrefix | None, limit: int
    ) -> tuple[TokenBlocks, CachedPrefix | None] | None:
        """The ids of ``base``'s prefix then ``text``, tokenizing only ``text`` (behind ``base``'s
        anchor), and the prefix to remember for the next turn: the ids through the last added
        token that ends within ``text[:limit]``, and the text after it up to ``limit``. ``None``:
        the anchor did not tokenize alone (cannot happen for an added token)."""
        shift = skip = 0
        if base is not None:
            whole = base.anchor + text
            enc = self._encode(whole)
            new = enc.ids
            if not new or new[0] != base.anchor_id:
                return None
            shift, skip = len(base.anchor), 1
            self.cache.hits += 1
        else:
            whole = text
            enc = self._encode(whole)
            new = enc.ids
            self.cache.misses += 1
        added = self.added_ids
        bound = limit + shift
        cut = len(new) - 1
        span: tuple[int, int] | None = None
        while cut >= skip:
            if new[cut] in added:
                span = enc.token_to_chars(cut)  # one token's offsets (not the whole list)
                if span is not None and span[1] <= bound:
                    break
            cut -= 1
        # (tiktoken's ids come as an ``array('i')``: joined by memcpy, no Python int per id)
        if base is not None:
            out = array("i", base.ids)
            out.extend(new[skip:] if type(new) is array else array("i", new[skip:]))
            blocks = TokenBlocks(out, base.keys, len(base.ids))
        else:
            out = new if type(new) is array else array("i", new)
            blocks = TokenBlocks(out)
        entry: CachedPrefix | None = None
        if cut >= skip and span is not None:
            a0, a1 = span
            kept = out[: len(out) - len(new) + cut + 1]
            entry = CachedPrefix("", kept, whole[a0:a1], new[cut], whole[a1:bound], blocks.known)
        elif base is not None:  # no added token in the new text: the same cut, more text after it
            entry = CachedPrefix("", base.ids, base.anchor, base.anchor_id, text[:limit], blocks.known)
        return blocks, entry
