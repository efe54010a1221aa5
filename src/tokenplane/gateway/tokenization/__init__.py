"""Tokenization at the gateway, per model: the model's tokenizer from a local folder
(:class:`LocalTokenizer`) or the instances' ``/tokenize`` (:class:`RemoteTokenizer`), so that
chat and text prompts are matched block by block against the engines' KV events
(:mod:`tokenplane.gateway.kv_events`). The tokenizer classes load on first use: importing the
config does not import ``tokenizers`` and ``jinja2``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenplane.gateway.tokenization.config import TokenizerConfig, build_tokenizers

if TYPE_CHECKING:
    from tokenplane.gateway.tokenization.local import LocalTokenizer
    from tokenplane.gateway.tokenization.remote import RemoteTokenizer


def __getattr__(name: str) -> Any:
    if name == "LocalTokenizer":
        from tokenplane.gateway.tokenization.local import LocalTokenizer

        return LocalTokenizer
    if name == "RemoteTokenizer":
        from tokenplane.gateway.tokenization.remote import RemoteTokenizer

        return RemoteTokenizer
    raise AttributeError(name)


__all__ = ["LocalTokenizer", "RemoteTokenizer", "TokenizerConfig", "build_tokenizers"]
