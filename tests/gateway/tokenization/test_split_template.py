"""Incremental rendering: a template admitted as separable renders a conversation as head, each
message on its own, tail, exactly as the whole template does; one that is not stays whole; and a
growing conversation tokenized turn by turn (only its new messages rendered and tokenized, its
block keys chained on) equals tokenizing it from scratch, whatever the options between turns."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenplane.gateway.kv_events import chain_keys
from tokenplane.gateway.tokenization import LocalTokenizer
from tokenplane.gateway.tokenization.chat_template import ChatTemplate, TemplateError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from tiny_model import CHAT_TEMPLATE  # the ChatML template of the tiny tokenizer

SPECIAL = {"bos_token": "<s>", "eos_token": "<|im_end|>"}

SEPARABLE = {
    "chatml": CHAT_TEMPLATE,
    "head, tail and a kwarg": (
        "{{ bos_token }}{% if tools %}[tools]{{ tools | tojson }}{% endif %}"
        "{% for m in messages %}{% set r = m['role'] | upper %}"
        "{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
        "<|im_start|>{{ r }}\n{{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>ASSISTANT\n{% if think %}<think>{% endif %}{% endif %}"
    ),
    "whitespace control": (
        "{%- for message in messages %}\n  {{- '<|im_start|>' + message.role }}\n"
        "{{ message.content }}<|im_end|>\n{% endfor -%}\n"
        "{%- if add_generation_prompt %}<|im_start|>\n{% endif %}"
    ),
}

NOT_SEPARABLE = {
    "loop.first": (
        "{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}{{ m.content }}{% endfor %}"
    ),
    "messages[0] in the head": (
        "{% if messages[0].role == 'system' %}S{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    ),
    "a namespace across turns": (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{% endfor %}"
    ),
    "break": (
        "{% for m in messages %}{% if m.role == 'x' %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    ),
    "two loops": (
        "{% for m in messages %}{{ m.role }}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
    ),
    "a filtered loop": "{% for m in messages if m.role != 'system' %}{{ m.content }}{% endfor %}",
    "a reversed loop": "{% for m in messages | reverse %}{{ m.content }}{% endfor %}",
    "the date": "{{ strftime_now('%d') }}{% for m in messages %}{{ m.content }}{% endfor %}",
    "messages in the body": "{% for m in messages %}{{ messages | length }}{{ m.content }}{% endfor %}",
    "loop.last": "{% for m in messages %}{{ m.content }}{% if loop.last %}<end>{% endif %}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(SEPARABLE))
def test_separable_templates_are_split(name: str) -> None:
    assert ChatTemplate(SEPARABLE[name], SPECIAL).split is not None


@pytest.mark.parametrize("name", sorted(NOT_SEPARABLE))
def test_templates_that_look_across_messages_are_rendered_whole(name: str) -> None:
    assert ChatTemplate(NOT_SEPARABLE[name], SPECIAL).split is None


KEY_ORDER = {
    "items, attributes": ("{{ m.role }}{{ m['content'] }}{{ m.name is defined }}", False),
    "tojson": ("{{ m | tojson }}", True),
    "items()": ("{% for k, v in m.items() %}{{ k }}{% endfor %}", True),
    "a missing item read as a dict attribute": ("{{ m['keys'] }}", True),
    "get": ("{{ m.get('role') }}", True),
    "in": ("{% if 'role' in m %}x{% endif %}", True),
    "passed on": ("{% set x = m %}{{ x.role }}", True),
}


@pytest.mark.parametrize("name", sorted(KEY_ORDER))
def test_a_loop_sees_key_order_unless_it_reads_only_items(name: str) -> None:
    body, sees = KEY_ORDER[name]
    split = ChatTemplate("{% for m in messages %}" + body + "{% endfor %}", SPECIAL).split
    assert split is not None
    assert split.key_order is sees


texts = st.text(alphabet=st.sampled_from(list("ab cé\n\t<|>水")), max_size=30)
roles = st.sampled_from(["system", "user", "assistant"])
message_lists = st.lists(st.fixed_dictionaries({"role": roles, "content": texts}), max_size=8)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(SEPARABLE)),
    messages=message_lists,
    cut=st.integers(0, 8),
    agp=st.booleans(),
    tools=st.sampled_from([None, [{"type": "function"}]]),
    think=st.booleans(),
)
def test_head_messages_tail_is_the_whole_rendering(
    name: str, messages: list[dict[str, str]], cut: int, agp: bool, tools: Any, think: bool
) -> None:
    template = ChatTemplate(SEPARABLE[name], SPECIAL)
    split = template.split
    assert split is not None
    variables = template.variables(agp, tools, None, {"think": think})
    cut = min(cut, len(messages))
    pieces = (
        split.head(variables)
        + split.messages(messages[:cut], variables)
        + split.messages(messages[cut:], variables)
        + split.tail(variables)
    )
    whole = template.render(messages, add_generation_prompt=agp, tools=tools, extra={"think": think})
    assert pieces == whole


LOOP_STATE = {
    **SEPARABLE,
    "autoescape and a set block in the loop": (
        "{% for m in messages %}{% autoescape true %}{% set c %}<{{ m.content }}>{% endset %}"
        "{{ m.role }}{{ c }}{% endautoescape %}{{ m.content }}{% endfor %}"
    ),
    "an error mid-autoescape": (
        "{% for m in messages %}{% autoescape true %}{{ m.content }}"
        "{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}{% endautoescape %}"
        "{{ m.content }}{% endfor %}"
    ),
}


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from(sorted(LOOP_STATE)), batches=st.lists(message_lists, max_size=6), think=st.booleans()
)
def test_a_bound_loop_renders_each_batch_as_a_fresh_render(
    name: str, batches: list[list[dict[str, str]]], think: bool
) -> None:
    """The loop kept with its context (:class:`MessagesLoop`) renders each batch as the template
    rendered afresh does, failures included, whatever it rendered before."""
    template = ChatTemplate(LOOP_STATE[name], SPECIAL)
    split = template.split
    assert split is not None
    variables = template.variables(True, None, None, {"think": think})
    loop = split.loop(variables)
    for batch in batches:
        try:
            expected: str | None = split.messages(batch, variables)
        except TemplateError:
            expected = None
        try:
            got: str | None = loop(batch)
        except TemplateError:
            got = None
        assert got == expected


def _folder(tokenizer_dir: Path, tmp: Path, template: str) -> Path:
    folder = tmp / "tok"
    if not folder.exists():
        shutil.copytree(tokenizer_dir, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


TOKENIZERS: dict[tuple[str, str], LocalTokenizer] = {}


def _tokenizer(tokenizer_dir: Path, tmp: Path, name: str, template: str) -> LocalTokenizer:
    key = (str(tokenizer_dir), name)
    if key not in TOKENIZERS:
        TOKENIZERS[key] = LocalTokenizer(_folder(tokenizer_dir, tmp / name.replace(" ", "_"), template))
    return TOKENIZERS[key]


options = st.fixed_dictionaries(
    {},
    optional={
        "add_generation_prompt": st.booleans(),
        "chat_template_kwargs": st.fixed_dictionaries({"think": st.booleans()}),
        "tools": st.just([{"type": "function"}]),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from([*sorted(SEPARABLE), "loop.first"]),
    system=texts,
    turns=st.lists(st.tuples(texts, texts, options), min_size=1, max_size=6),
)
def test_turn_by_turn_equals_from_scratch(
    tokenizer_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    system: str,
    turns: list[tuple[str, str, dict[str, Any]]],
) -> None:
    source = SEPARABLE.get(name) or NOT_SEPARABLE[name]
    tok = _tokenizer(tokenizer_dir, tmp_path_factory.getbasetemp(), name, source)
    assert (tok.template is not None and tok.template.split is not None) == (name in SEPARABLE)
    hits = tok.cache.hits
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for user, reply, opts in turns:
        messages.append({"role": "user", "content": user})
        body = {"messages": messages, **opts}
        blocks = tok.chat_blocks(json.loads(json.dumps(body)))  # fresh objects, as from the wire
        text = tok.render(messages, body)
        assert text is not None and blocks is not None
        want = tok.tokenizer.encode(text, add_special_tokens=False).ids
        assert list(blocks.ids) == want
        assert blocks.keys(4) == chain_keys(want, 4)
        messages.append({"role": "assistant", "content": reply})
    if len(turns) > 2 and not any(opts for _, _, opts in turns):
        assert tok.cache.hits > hits


def test_a_growing_conversation_hashes_only_its_new_blocks(tokenizer_dir: Path) -> None:
    tok = LocalTokenizer(tokenizer_dir)
    messages: list[dict[str, str]] = [{"role": "system", "content": "the answer is a token " * 20}]
    previous = 0
    for turn in range(4):
        messages.append({"role": "user", "content": f"question {turn} " * 15})
        blocks = tok.chat_blocks({"messages": messages})
        assert blocks is not None
        keys = blocks.keys(16)
        assert keys == chain_keys(list(blocks.ids), 16)
        if turn:
            assert blocks.hashed == len(keys) - previous  # the cached prefix's keys were reused
        previous = len(tok.cache.get(_last_key(tok)).ids) // 16  # type: ignore[union-attr]
        messages.append({"role": "assistant", "content": f"answer {turn} " * 30})
    assert tok.cache.hits == 3 and tok.cache.misses == 1


def _last_key(tok: LocalTokenizer) -> Any:
    return next(reversed(tok.cache._entries))
