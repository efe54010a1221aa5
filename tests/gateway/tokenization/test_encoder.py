"""The encoder behind the local tokenizer: fastokens, else tiktoken, where it gives the
``tokenizers`` library's ids exactly, checked at load, else ``tokenizers`` with the reason."""

from __future__ import annotations

import itertools
import json
import shutil
import sys
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tokenplane.gateway.errors import ConfigError
from tokenplane.gateway.tokenization import LocalTokenizer, TokenizerConfig
from tokenplane.gateway.tokenization.encoder import GPT2_PATTERN, PROBE, TiktokenEncoder
from tokenplane.gateway.tokenization.exactness import NotExact
from tokenplane.gateway.tokenization.fast import FastokensEncoder, check_fast
from tokenplane.gateway.tokenization.plain import _WIDE_GAP, may_have_wide_gap, plain_pattern

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """A Llama-3-shaped tokenizer: Split(Llama 3's regex, Isolated) then ByteLevel(use_regex=false),
    a post-processor that adds BOS, trained with the ``tokenizers`` library on varied text."""
    folder = tmp_path_factory.mktemp("tok") / "split"
    folder.mkdir()
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [*PROBE, *(Path(__file__).parent.glob("*.py"))]
    tok.train_from_iterator([c if isinstance(c, str) else c.read_text() for c in corpus] * 3, trainer=trainer)
    bos = tok.token_to_id(SPECIALS[0])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIALS[0]} $A", pair=f"{SPECIALS[0]} $A $B", special_tokens=[(SPECIALS[0], bos)]
    )
    tok.save(str(folder / "tokenizer.json"))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _edited(src: Path, dst: Path, edit: Any) -> Path:
    shutil.copytree(src, dst)
    spec = json.loads((dst / "tokenizer.json").read_text())
    edit(spec)
    (dst / "tokenizer.json").write_text(json.dumps(spec))
    return dst


def test_byte_level_tokenizers_run_on_fastokens_else_tiktoken(
    tokenizer_dir: Path, split_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for folder in (tokenizer_dir, split_dir):
        tok = LocalTokenizer(folder)
        assert (tok.encoder.name, tok.encoder_reason) == ("fastokens", None)
        assert LocalTokenizer(folder, encoder="tiktoken").encoder.name == "tiktoken"
        # the post-processor's BOS on text prompts, as tokenizers adds it
        want = tok.tokenizer.encode("hello there", add_special_tokens=True).ids
        assert tok.text("hello there") == want
        assert LocalTokenizer(folder, encoder="tiktoken").text("hello there") == want
    split = LocalTokenizer(split_dir)
    assert split.text("hello there")[0] == split.tokenizer.token_to_id(SPECIALS[0])
    monkeypatch.setitem(sys.modules, "fastokens", None)  # as where it is not installed
    tok = LocalTokenizer(tokenizer_dir)
    assert tok.encoder.name == "tiktoken"
    assert tok.encoder_reason == "fastokens: fastokens is not installed"
    with pytest.raises(ConfigError, match="fastokens is not exact: fastokens is not installed"):
        LocalTokenizer(tokenizer_dir, encoder="fastokens")


def _text(added: list[str]) -> st.SearchStrategy[str]:
    piece = st.one_of(
        st.text(max_size=12),  # any unicode, surrogates excluded
        st.text(alphabet=st.sampled_from(list(" \n\t\r'sltdmrev0123456789.,:_-<|>éà水👍")), max_size=20),
        st.sampled_from([*added, *(a[:-1] for a in added), " ", "  ", "\n\n", "'ll", "'S"]),
    )
    return st.lists(piece, max_size=12).map("".join)


@pytest.fixture(scope="module")
def loaded(tokenizer_dir: Path, split_dir: Path) -> dict[str, LocalTokenizer]:
    """tiktoken's encoders (``tiny``, ``split``) and fastokens' (``tiny-fast``, ``split-fast``)."""
    return {
        "tiny": LocalTokenizer(tokenizer_dir, encoder="tiktoken"),
        "split": LocalTokenizer(split_dir, encoder="tiktoken"),
        "tiny-fast": LocalTokenizer(tokenizer_dir, encoder="fastokens"),
        "split-fast": LocalTokenizer(split_dir, encoder="fastokens"),
    }


@pytest.mark.parametrize("which", ["tiny", "split", "tiny-fast", "split-fast"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fast_encoders_ids_are_tokenizers_ids(
    which: str, loaded: dict[str, LocalTokenizer], data: st.DataObject
) -> None:
    tok = loaded[which]
    assert tok.encoder.name == ("fastokens" if which.endswith("-fast") else "tiktoken")
    text = data.draw(_text(sorted(t.content for t in tok.tokenizer.get_added_tokens_decoder().values())))
    enc = tok.encoder.encode(text)
    want = tok.tokenizer.encode(text, add_special_tokens=False)
    assert list(enc.ids) == want.ids
    for i, token in enumerate(want.ids):  # where the added tokens are, which the prefix cache cuts at
        if token in tok.added_ids:
            assert enc.token_to_chars(i) == want.token_to_chars(i)
    assert tok.text(text) == tok.tokenizer.encode(text, add_special_tokens=True).ids


def _swap_merges(spec: dict[str, Any]) -> None:
    merges = spec["model"]["merges"]
    merges[10], merges[11] = merges[11], merges[10]


def _flag(flag: str) -> Any:
    def edit(spec: dict[str, Any]) -> None:
        spec["added_tokens"][3][flag] = True

    return edit


def _prefix_token(spec: dict[str, Any]) -> None:
    new = max(spec["model"]["vocab"].values()) + 1
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    spec["added_tokens"].append({"id": new, "content": "<|im", **flags})


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda s: s.update(normalizer={"type": "NFC"}), "normalizer NFC"),
        (lambda s: s.update(normalizer={"type": "Lowercase"}), "normalizer Lowercase"),
        (_swap_merges, "merges are not in the order"),
        (_flag("lstrip"), "has lstrip"),
        (_flag("single_word"), "has single_word"),
        (_prefix_token, "is a prefix of"),
        (lambda s: s["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
        (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer Whitespace"),
        (lambda s: s["model"].update(byte_fallback=True), "byte_fallback"),
    ],
)
def test_what_tiktoken_cannot_run_exactly_falls_back_with_its_reason(
    tokenizer_dir: Path, tmp_path: Path, edit: Any, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _edited(tokenizer_dir, tmp_path / "tok", edit)
    text = "<|im_start|>user\nHi there<|im_end|>\n"
    with pytest.raises(ConfigError, match="tiktoken is not exact"):
        LocalTokenizer(folder, encoder="tiktoken")
    # fastokens reads tokenizer.json itself: where it is exact it runs these too
    tok = LocalTokenizer(folder)
    assert tok.encoder.name in ("fastokens", "hf")
    assert tok.text(text) == tok.tokenizer.encode(text).ids
    monkeypatch.setitem(sys.modules, "fastokens", None)
    tok = LocalTokenizer(folder)
    assert tok.encoder.name == "hf"
    assert tok.encoder_reason is not None and reason in tok.encoder_reason
    # and it still tokenizes, as tokenizers does
    assert tok.text(text) == tok.tokenizer.encode(text).ids


def test_a_probe_mismatch_falls_back(tokenizer_dir: Path, tmp_path: Path) -> None:
    """A tokenizer that passes the structural checks but tokenizes differently (a vocabulary entry
    two merges reach, which tiktoken would make and tokenizers would not) is caught by the probe."""

    def unreachable(spec: dict[str, Any]) -> None:
        # a word piece "Ġxy" that the vocabulary has but no merge makes: tiktoken merges any pair
        # whose concatenation is in the vocabulary, tokenizers only the listed merges
        vocab = spec["model"]["vocab"]
        heads = [t for t in vocab if t.startswith("Ġ") and t[1:].isalpha() and len(t) > 2]
        tails = [t for t in vocab if t.isalpha() and len(t) > 1]
        x, y = next((h, t) for h in heads for t in tails if h + t not in vocab)
        vocab[x + y] = max(vocab.values()) + 1

    folder = _edited(tokenizer_dir, tmp_path / "tok", unreachable)
    with pytest.raises(ConfigError, match="tiktoken is not exact: vocabulary entry"):
        LocalTokenizer(folder, encoder="tiktoken")
    assert LocalTokenizer(folder).encoder.name == "fastokens"  # it merges as tokenizers does


class _OffByOne:
    """fastokens, but one id in the vocabulary's upper half comes out as its neighbour."""

    def __init__(self, tokenizer: Any, wrong: int) -> None:
        self.tokenizer = tokenizer
        self.wrong = wrong

    def encode(self, text: str, add_special_tokens: bool = False) -> Any:
        ids = [i + 1 if i == self.wrong else i for i in self.tokenizer.encode(text, add_special_tokens).ids]
        return SimpleNamespace(ids=ids)

    def encode_batch_flat(self, texts: list[str], add_special_tokens: bool = False) -> tuple[bytes, bytes]:
        ids = [i for t in texts for i in self.encode(t, add_special_tokens).ids]
        return array("I", ids).tobytes(), b""


def test_a_fastokens_mismatch_is_caught_by_the_vocabulary_check(tokenizer_dir: Path) -> None:
    """An id the probe never produces still shows: the check encodes the whole vocabulary."""
    tok = LocalTokenizer(tokenizer_dir, encoder="fastokens")
    encoder = tok.encoder
    assert isinstance(encoder, FastokensEncoder)
    added = {t.content: i for i, t in tok.tokenizer.get_added_tokens_decoder().items()}
    probe_ids = {i for text in PROBE for i in tok.tokenizer.encode(text, add_special_tokens=False).ids}
    vocab = tok.tokenizer.get_vocab()
    wrong = max(i for i in vocab.values() if i not in probe_ids and i not in added.values())
    fake = FastokensEncoder(_OffByOne(encoder._tokenizer, wrong), added)
    with pytest.raises(NotExact, match="vocabulary text"):
        check_fast(tok.tokenizer, fake, added)
    check_fast(tok.tokenizer, encoder, added)  # the real one passes


def test_lone_surrogates_are_refused_as_tokenizers_refuses_them(tokenizer_dir: Path) -> None:
    """Not UTF-8: an error the tokenize stage turns into approximate routing, never other ids."""
    tok = LocalTokenizer(tokenizer_dir, encoder="fastokens")
    with pytest.raises(UnicodeEncodeError):
        tok.text("a\ud800b")


def test_the_encoder_knob(tokenizer_dir: Path) -> None:
    tok = LocalTokenizer(tokenizer_dir, encoder="hf")
    assert (tok.encoder.name, tok.encoder_reason) == ("hf", "encoder: hf configured")
    assert LocalTokenizer(tokenizer_dir, encoder="tiktoken").encoder.name == "tiktoken"
    assert LocalTokenizer(tokenizer_dir, encoder="fastokens").encoder.name == "fastokens"
    assert TokenizerConfig(path=str(tokenizer_dir), encoder="fastokens").encoder == "fastokens"
    assert TokenizerConfig(path=str(tokenizer_dir)).encoder == "auto"
    with pytest.raises(ValueError, match="'encoder' is for source: local"):
        TokenizerConfig(source="remote", encoder="hf")


# -- the lookahead-free pattern (plain_pattern): the same ids where it is used ------------------

# every White_Space character, the four that Python's \s takes and tiktoken's does not, and the
# characters around them
_GAPS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\x1c\x1d\x1e\x1f"


def test_plain_pattern_drops_only_a_final_lookahead() -> None:
    assert plain_pattern(GPT2_PATTERN) == GPT2_PATTERN.removesuffix(r"|\s+(?!\S)|\s+") + r"|\s+"
    assert plain_pattern(LLAMA3_PATTERN) == LLAMA3_PATTERN.removesuffix(r"|\s+(?!\S)|\s+") + r"|\s+"
    assert plain_pattern(r"\w+|\s+") is None  # no lookahead to drop
    assert plain_pattern(r"(?=x)\w+|\s+(?!\S)|\s+") is None  # another lookaround stays


@pytest.mark.parametrize("which", ["tiny", "split"])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_plain_pattern_gives_the_lookahead_patterns_ids(
    which: str, loaded: dict[str, LocalTokenizer], data: st.DataObject
) -> None:
    """Old (the lookahead pattern everywhere) and new (the plain one where no wide gap) agree,
    on texts made mostly of white space runs between words, punctuation and added tokens."""
    encoder = loaded[which].encoder
    assert isinstance(encoder, TiktokenEncoder) and encoder._plain is not None
    added = sorted(encoder._added)
    piece = st.one_of(
        st.text(alphabet=st.sampled_from(list(_GAPS)), min_size=1, max_size=4),
        st.sampled_from(["a", "ab", "'s", "x1", "7", ".", "!?", "é", "水", *added]),
        st.text(max_size=4),
    )
    text = data.draw(st.lists(piece, max_size=16).map("".join))
    old = encoder._encoding.encode(text, allowed_special=encoder._added, disallowed_special=())
    assert list(encoder.encode(text).ids) == old
    assert encoder.encode_text(text) == [*encoder._prefix, *old, *encoder._suffix]
    gap = _WIDE_GAP.search(text) is not None
    assert may_have_wide_gap(text) or not gap  # (a superset)
    if not gap:  # where the plain pattern may run, it is the lookahead's split
        plain = encoder._plain.encode(text, allowed_special=encoder._added, disallowed_special=())
        assert plain == old


def test_the_plain_pattern_is_used_and_a_wide_gap_is_not_given_to_it(
    loaded: dict[str, LocalTokenizer],
) -> None:
    encoder = loaded["tiny"].encoder
    assert isinstance(encoder, TiktokenEncoder) and encoder._plain is not None
    plain = encoder._plain.encode
    wide = "indented\n    code and  two spaces"
    assert _WIDE_GAP.search(wide) is not None and may_have_wide_gap(wide)
    assert plain(wide) != encoder._encoding.encode(wide)  # the reason it is not used there
    assert list(encoder.encode(wide).ids) == encoder._encoding.encode(wide)
    narrow = "one space\nbetween words\u3000at the end "
    assert _WIDE_GAP.search(narrow) is None and not may_have_wide_gap(narrow)
    assert list(encoder.encode(narrow).ids) == plain(narrow) == encoder._encoding.encode(narrow)


@given(
    st.lists(st.sampled_from(["a", "b.", " ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "x y"]), max_size=12)
)
def test_the_gap_check_misses_no_wide_gap(pieces: list[str]) -> None:
    text = "".join(pieces)
    if _WIDE_GAP.search(text) is not None:
        assert may_have_wide_gap(text)
    if not any(a in _ASCII and b in _ASCII for a, b in itertools.pairwise(text)):
        assert not may_have_wide_gap(text)  # only touching white spaces make it say so


_ASCII = _GAPS[:16]  # White_Space


# -- cuts (plain.gap_cuts): only for the patterns they are exact for -----------------------------

_PARAGRAPHS = (
    "First paragraph.  Two spaces after it.\n\nSecond one:\n\n```python\ndef f(x):\n    y = x + 1\n\n"
    "        return y\n```\n\n- a list item\n- another, with 12 and 345\n\n\tTabbed\t\tline.\n\n   end   "
)


def _pattern_edit(pattern: str) -> Any:
    def edit(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern

    return edit


def _spaced_token(spec: dict[str, Any]) -> None:
    top = max(*spec["model"]["vocab"].values(), *(t["id"] for t in spec["added_tokens"])) + 1
    spec["added_tokens"].append(
        {"id": top, "content": "<|a b|>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
    )  # fmt: skip


def test_cuts_only_where_they_are_exact(
    loaded: dict[str, LocalTokenizer], split_dir: Path, tmp_path: Path
) -> None:
    qwen2 = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
    dirs = {
        "qwen2": _edited(split_dir, tmp_path / "qwen2", _pattern_edit(qwen2)),
        "other": _edited(
            split_dir, tmp_path / "other", _pattern_edit(LLAMA3_PATTERN.replace("{1,3}", "{1,2}"))
        ),
        "spaced": _edited(split_dir, tmp_path / "spaced", _spaced_token),
    }
    tokenizers = {
        "tiny": loaded["tiny"],
        "split": loaded["split"],
        **{name: LocalTokenizer(d, encoder="tiktoken") for name, d in dirs.items()},
    }
    cut = {}
    for name, tok in tokenizers.items():
        encoder = tok.encoder
        assert isinstance(encoder, TiktokenEncoder) and encoder._plain is not None, name
        cut[name] = encoder._cut
        text = f"{_PARAGRAPHS}{_PARAGRAPHS.replace('.', '.<|eot_id|>')}"
        want = tok.tokenizer.encode(text, add_special_tokens=False).ids
        assert list(encoder.encode(text).ids) == want, name
    assert cut == {"tiny": False, "split": True, "qwen2": True, "other": None, "spaced": None}


@pytest.mark.parametrize("which", ["tiny", "split", "tiny-fast", "split-fast"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_added_tokens_found_from_the_end_of_long_texts(
    which: str, loaded: dict[str, LocalTokenizer], data: st.DataObject
) -> None:
    """Texts longer than the tail :class:`~.added.Pieces` searches first (the last added token, then
    earlier ones: the tail's matches, then the whole text's)."""
    tok = loaded[which]
    added = sorted(t.content for t in tok.tokenizer.get_added_tokens_decoder().values())
    text = "".join(data.draw(st.lists(_text(added), min_size=20, max_size=80))) + " a" * 300
    text = data.draw(st.sampled_from(added)).join([text[:200], text[200:], text[-100:]])
    enc = tok.encoder.encode(text)
    want = tok.tokenizer.encode(text, add_special_tokens=False)
    assert list(enc.ids) == want.ids
    for i in reversed(range(len(want.ids))):
        if want.ids[i] in tok.added_ids:
            assert enc.token_to_chars(i) == want.token_to_chars(i)
