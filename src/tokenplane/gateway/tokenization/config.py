"""``models[].tokenizer``: where a model's tokenizer comes from.

    tokenizer: {path: /models/llama-3-8b}             # local: tokenizer.json + chat template
    tokenizer: {source: remote, timeout_s: 1.0}       # the model's instances' POST /tokenize
    tokenizer: {path: /models/llama-3-8b, encoder: hf}  # local, always with `tokenizers`

``encoder`` (local): ``auto`` (default) encodes with ``fastokens``, else ``tiktoken``, where it
gives exactly the ids ``tokenizers`` gives for this ``tokenizer.json`` (checked at load), else with
``tokenizers``, the reasons logged; ``fastokens`` or ``tiktoken`` refuses to start where that one
would not be exact; ``hf`` uses neither (:mod:`~tokenplane.gateway.tokenization.encoder`,
:mod:`~tokenplane.gateway.tokenization.fast`).

``cache_entries`` / ``cache_tokens`` bound the conversation-prefix cache
(:mod:`~tokenplane.gateway.tokenization.prefix_cache`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tokenplane.gateway.tokenization.prefix_cache import DEFAULT_CACHE_ENTRIES, DEFAULT_CACHE_TOKENS

if TYPE_CHECKING:
    import aiohttp

    from tokenplane.gateway.tokenization.local import LocalTokenizer
    from tokenplane.gateway.tokenization.remote import RemoteTokenizer


class TokenizerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["local", "remote"] = "local"
    path: str | None = None
    """local: the folder holding ``tokenizer.json`` (and ``tokenizer_config.json`` /
    ``chat_template.jinja`` for chat)."""
    timeout_s: float = Field(1.0, gt=0)
    """remote: per ``/tokenize`` call."""
    encoder: Literal["auto", "fastokens", "tiktoken", "hf"] = "auto"
    """local: which library encodes (see the module's docstring)."""
    cache_entries: int = Field(DEFAULT_CACHE_ENTRIES, ge=0)
    cache_tokens: int = Field(DEFAULT_CACHE_TOKENS, ge=0)

    @model_validator(mode="after")
    def _where(self) -> TokenizerConfig:
        if self.source == "local":
            if not self.path:
                raise ValueError("a local tokenizer needs 'path' (a folder with tokenizer.json)")
            if not (Path(self.path) / "tokenizer.json").is_file():
                raise ValueError(f"{self.path}/tokenizer.json does not exist")
        elif self.path is not None:
            raise ValueError("'path' is for source: local")
        elif self.encoder != "auto":
            raise ValueError("'encoder' is for source: local")
        return self


Tokenizers = dict[str, "LocalTokenizer | RemoteTokenizer"]


def build_tokenizers(
    models: Iterable[Any],
    instances: Sequence[Any],
    session: Callable[[], aiohttp.ClientSession | None],
) -> Tokenizers:
    """One tokenizer per model that configures one (``models[].tokenizer``); models without stay
    on the approximate index."""
    from tokenplane.gateway.tokenization.local import LocalTokenizer
    from tokenplane.gateway.tokenization.remote import RemoteTokenizer

    out: Tokenizers = {}
    for m in models:
        cfg: TokenizerConfig | None = getattr(m, "tokenizer", None)
        if cfg is None:
            continue
        if cfg.source == "local":
            assert cfg.path is not None
            out[m.name] = LocalTokenizer(
                cfg.path, cache_entries=cfg.cache_entries, cache_tokens=cfg.cache_tokens, encoder=cfg.encoder
            )
        else:
            urls = [i.url for i in instances if i.model == m.name]
            out[m.name] = RemoteTokenizer(
                urls, m.served_name, session, timeout_s=cfg.timeout_s, cache_entries=cfg.cache_entries
            )
    return out
