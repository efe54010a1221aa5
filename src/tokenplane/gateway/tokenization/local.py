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
from itertools import chain
from pathlib import Path
from typing import Any, Literal

import msgspec
from tokenizers import Tokenizer

from tokenplane.gateway.errors import ConfigError
from tokenplane.gateway.token_blocks import TokenBlocks
from tokenplane.gateway.tokenization.added import Pieces
from tokenplane.gateway.tokenization.chat_template import (
    ChatTemplate,
    MessagesLoop,
    SplitTemplate,
    TemplateError,
)
from tokenplane.gateway.tokenization.encoder import EncoderChoice, NotExact, load_encoder
from tokenplane.gateway.tokenization.prefix_cache import (
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_CACHE_TOKENS,
    CachedPrefix,
    PrefixCache,
    SeenMessages,
)

_encode_json = msgspec.json.Encoder().encode
# Where the template cannot see the keys' order, a message kept as JSON is kept with its keys
# sorted (at every depth), so that the same message sent with its keys reordered still matches.
_encode_sorted = msgspec.json.Encoder(order="sorted").encode
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


def _message_form(message: dict[str, Any]) -> Any:
    """What tells a message from another: its items as sent (key order included) where every
    value is a string (the usual one: role, content, name), else its JSON text (``1``, ``1.0`` and
    ``True`` are equal in Python, not as JSON)."""
    for value in message.values():
        if type(value) is not str:
            return _encode_json(message)
    return tuple(message.items())


def prefix_key(root: int, k: int, last: dict[str, Any]) -> int:
    """The cache key of a prefix of ``k`` messages whose last is ``last`` (``root``: everything
    else the template is rendered with). Not a digest of the messages: a string ``content`` is
    named by its length and ends (hashing it all would be a pass over it per request: a JSON
    body's strings are new objects each time); whether the messages are the entry's is checked
    by :func:`_same_messages` where it matters (per-message rendering), and a whole rendering
    against the entry's text. Two prefixes alike in all of that share a key: the later one is
    kept, the other is only tokenized again."""
    content = last.get("content")
    if type(content) is str:
        return hash((root, k, len(content), content[:_KEY_ENDS], content[-_KEY_ENDS:]))
    return hash((root, k, _message_form(last)))


_KEY_ENDS = 24


def _same_messages(seen: SeenMessages | None, raw: list[Any], k: int, key_order: bool = True) -> bool:
    """Whether ``raw[:k]`` are ``seen``'s messages exactly as sent. All plain: dict equality (in C,
    a memcmp per string; a string equals only a string, and a JSON body's values are str, int,
    float, bool, None, list or dict) and, where the template may see it (``key_order``), the keys'
    order; else message by message."""
    if seen is None or len(seen.messages) != k:
        return False
    head = raw[:k]
    if seen.plain:
        return head == seen.messages and (not key_order or tuple(chain.from_iterable(head)) == seen.order)
    encode = _encode_json if key_order else _encode_sorted
    for a, b in zip(head, seen.messages, strict=True):
        if type(b) is bytes:
            if encode(a) != b:
                return False
        elif a != b or (key_order and list(a) != list(b)):
            return False
    return True


def _seen_after(base: SeenMessages | None, new: list[dict[str, Any]], key_order: bool = True) -> SeenMessages:
    """``base``'s messages then ``new``'s (``base``'s strings shared, ``new``'s copied as kept);
    their keys' order only where the template may see it (``key_order``)."""
    if base is None:
        kept: list[Any] = []
        plain, chars, order = True, 0, ()
    else:
        kept, plain, chars, order = base.messages.copy(), base.plain, base.chars, base.order
    encode = _encode_json if key_order else _encode_sorted
    for m in new:
        for value in m.values():
            if type(value) is not str:
                form = encode(m)
                plain = False
                kept.append(form)
                chars += len(form)
                break
        else:
            kept.append(m.copy())
            chars += sum(map(len, m.values()))
    return SeenMessages(kept, order + tuple(chain.from_iterable(new)) if key_order else (), plain, chars)


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
        # per rendering options (the root digest): a split template's loop (its variables bound),
        # head and tail
        self._ends: dict[int, tuple[MessagesLoop, str, str]] = {}

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
        # root: everything the template is rendered with besides the messages (a prefix's key
        # names its messages by their count and the last one: :func:`prefix_key`)
        root: int = hash(
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
        for m in raw:
            if type(m) is not dict:
                return None
        if template.split is not None and body.get("continue_final_message") is not True:
            ids = self._chat_split(template.split, template, raw, root, body)
            if ids is not False:
                return ids
        return self._chat_whole(raw, root, body)

    def _chat_split(
        self,
        split: SplitTemplate,
        template: ChatTemplate,
        raw: list[Any],
        root: int,
        body: Mapping[str, Any],
    ) -> TokenBlocks | Literal[False] | None:
        """Render and tokenize only the messages after the longest cached prefix (``False``: the
        cached prefix did not fit, do it whole)."""
        cache = self.cache
        key_order = split.key_order
        n = len(raw)
        key = prefix_key(root, n, raw[-1])
        k, base = n, None
        while k:
            entry = cache.get(key if k == n else prefix_key(root, k, raw[k - 1]))
            if entry is not None and _same_messages(entry.seen, raw, k, key_order):
                base = entry
                break
            k -= 1
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
                ends = (split.loop(variables), split.head(variables), split.tail(variables))
                if len(self._ends) >= _ENDS_MAX:
                    self._ends.clear()
                self._ends[root] = ends
            loop, head, tail = ends
            text = (base.rest if base is not None else head) + loop(messages)
        except TemplateError:
            return None
        done = self._extend(text + tail, base, len(text))
        if done is None:
            return False
        blocks, new = done
        if new is not None:
            new.seen = _seen_after(None if base is None else base.seen, raw[k:], key_order)
            cache.put(key, new)
        return blocks

    def _chat_whole(self, raw: list[Any], root: int, body: Mapping[str, Any]) -> TokenBlocks | None:
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
        for k in range(len(raw), 0, -1):  # (the text is checked, not the messages)
            entry = cache.get(prefix_key(root, k, raw[k - 1]))
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
            cache.put(prefix_key(root, len(raw), raw[-1]), new)
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
        bound = limit + shift
        span: tuple[int, int] | None = None
        if type(enc) is Pieces:  # (tiktoken, fastokens: one search of the text)
            found = enc.last_added(bound)
            cut = skip - 1 if found is None else found[0]
            if found is not None:
                span = found[1], found[2]
        else:
            added = self.added_ids
            cut = len(new) - 1
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
