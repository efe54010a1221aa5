"""A model's chat template, rendered as Hugging Face ``transformers`` renders it (and so vLLM).

``apply_chat_template(..., tokenize=False)`` compiles the template in a sandboxed Jinja environment
(``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the ``loopcontrols``
extension and a ``{% generation %}`` tag), adds ``tojson`` (``json.dumps`` without ASCII escaping),
``raise_exception`` and ``strftime_now``, and renders it with ``messages``, ``tools``,
``documents``, ``add_generation_prompt`` and the tokenizer's special tokens (``bos_token``,
``eos_token``...). ``continue_final_message`` cuts the text right after the final message's
content. This module does the same with ``jinja2`` alone.

Incremental rendering (:class:`SplitTemplate`): a template whose text is a head, one loop over
``messages`` and a tail, where no iteration can see another (the loop body reads neither ``loop``
nor ``messages``, has no ``break``; head and tail read no ``messages`` and set nothing; nothing
calls ``strftime_now``), renders as ``head + body(m_0) + ... + body(m_n-1) + tail``: Jinja's output
is the concatenation of its statements' outputs, a ``for`` loop's the concatenation of its
iterations', and an assignment inside a loop body does not outlive its iteration. So a growing
conversation renders only its new messages. ChatML-style templates qualify; templates that look at
``loop.first``, ``messages[0]`` or a namespace (Llama 3, Qwen 2.5, Mistral) do not, and are
rendered whole. The check is syntactic and conservative: a template it admits is rendered
exactly, one it refuses only loses the shortcut.

Where the template lives: ``chat_template.jinja`` beside the tokenizer (newer ``transformers``
save it there), else ``chat_template`` in ``tokenizer_config.json`` (a string, or a list of named
templates of which ``default`` is used).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenplane.gateway.errors import ConfigError


class TemplateError(ValueError):
    """The template refused the conversation (its ``raise_exception``) or failed to render."""


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; rendering
    keeps the body as is (what transformers does when no mask is asked for)."""

    tags = {"generation"}  # noqa: RUF012 (jinja2.ext.Extension declares it so)

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        body: list[nodes.Node] = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return body


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def load_template_source(folder: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    source = config.get("chat_template")
    if isinstance(source, str):
        return source
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        default = named.get("default")
        if isinstance(default, str):
            return default
    return None


_SCOPE_NODES = (
    nodes.Assign,
    nodes.AssignBlock,
    nodes.Macro,
    nodes.CallBlock,
    nodes.Import,
    nodes.FromImport,
    nodes.Include,
    nodes.Extends,
    nodes.Block,
)


def _loads(node: nodes.Node) -> set[str]:
    return {n.name for n in node.find_all(nodes.Name) if n.ctx == "load"}


def _separable_loop(tree: nodes.Template) -> int | None:
    """The index in ``tree.body`` of the one loop over ``messages`` if the template renders
    message by message (see the module's docstring), else ``None``."""
    loops = [i for i, n in enumerate(tree.body) if isinstance(n, nodes.For)]
    if len(loops) != 1:
        return None
    at = loops[0]
    loop = tree.body[at]
    assert isinstance(loop, nodes.For)
    if not (
        isinstance(loop.iter, nodes.Name)
        and loop.iter.name == "messages"
        and isinstance(loop.target, nodes.Name)
        and not loop.else_
        and loop.test is None
        and not loop.recursive
    ):
        return None
    body = nodes.Template(loop.body)
    if _loads(body) & {"loop", "messages", "strftime_now"} or any(body.find_all(nodes.Break)):
        return None
    if any(body.find_all((nodes.Extends, nodes.Block, nodes.Include, nodes.Import, nodes.FromImport))):
        return None
    for node in tree.body[:at] + tree.body[at + 1 :]:
        if isinstance(node, _SCOPE_NODES) or any(node.find_all(_SCOPE_NODES)):
            return None
        if _loads(node) & {"messages", "loop", "strftime_now"}:
            return None
    return at


def _sees_key_order(loop: nodes.For) -> bool:
    """Whether the loop's body may see the order of a message's keys: it uses the message other
    than by a constant item or attribute (``message['role']``, ``message.content``) that is not a
    ``dict`` attribute (``message.items()``, a missing ``message['keys']`` that the sandbox then
    reads as the attribute). Conservative: any other use of the name (a filter, a test, ``in``,
    passing it on, assigning it) counts as seeing it."""
    assert isinstance(loop.target, nodes.Name)
    name = loop.target.name
    body = nodes.Template(loop.body)
    uses = sum(1 for n in body.find_all(nodes.Name) if n.name == name)
    plain = 0
    for n in body.find_all((nodes.Getitem, nodes.Getattr)):
        assert isinstance(n, (nodes.Getitem, nodes.Getattr))
        if not (isinstance(n.node, nodes.Name) and n.node.name == name):
            continue
        if isinstance(n, nodes.Getattr):
            key: Any = n.attr
        else:
            key = n.arg.value if isinstance(n.arg, nodes.Const) else None
        if type(key) is str and not hasattr(dict, key):
            plain += 1
    return plain != uses


class SplitTemplate:
    """A separable template as three: head, the loop over ``messages``, tail. ``key_order``: the
    loop may see the order of a message's keys (:func:`_sees_key_order`), so a message equal to
    another as a dict but with its keys in another order may render differently."""

    __slots__ = ("_head", "_loop", "_tail", "key_order")

    def __init__(self, env: jinja2.Environment, tree: nodes.Template, at: int) -> None:
        loop = tree.body[at]
        assert isinstance(loop, nodes.For)
        self.key_order = _sees_key_order(loop)
        self._head = _Compiled(env.from_string(nodes.Template(tree.body[:at])))
        self._loop = _Compiled(env.from_string(nodes.Template([tree.body[at]])))
        self._tail = _Compiled(env.from_string(nodes.Template(tree.body[at + 1 :])))

    def head(self, variables: Mapping[str, Any]) -> str:
        return self._head(variables, ())

    def messages(self, messages: Sequence[Mapping[str, Any]], variables: Mapping[str, Any]) -> str:
        return self._loop(variables, messages)

    def loop(self, variables: Mapping[str, Any]) -> MessagesLoop:
        """:meth:`messages` with ``variables`` bound, for many calls."""
        return MessagesLoop(self._loop, variables)

    def tail(self, variables: Mapping[str, Any]) -> str:
        return self._tail(variables, ())


class _Compiled:
    """A compiled template rendered as ``template.render(variables, messages=messages)``, less its
    cost per call: the context is built from one dict (``render`` merges and scans the
    environment's globals, a ``ChainMap``, twice per call), and the template's globals are read
    once (``Template.new_context`` hands the ``ChainMap`` to ``Context``, which makes a set of its
    keys each call: ~20 k instructions a request). The context is the one ``new_context(...,
    shared=True)`` makes: the same parent dict, name, blocks and globals' keys."""

    __slots__ = ("_blocks", "_context", "_env", "_globals", "_name", "_root")

    def __init__(self, template: jinja2.Template) -> None:
        self._root = template.root_render_func
        self._env = template.environment
        self._context = template.environment.context_class
        self._name = template.name
        self._blocks = template.blocks
        self._globals = dict(template.globals)

    def __call__(self, variables: Mapping[str, Any], messages: Any) -> str:
        return self.run(self.context({**self._globals, **variables, "messages": messages}))

    def context(self, parent: dict[str, Any]) -> Any:
        """A render context over ``parent`` (the globals, variables and ``messages``)."""
        return self._context(self._env, parent, self._name, self._blocks, globals=self._globals)

    def run(self, ctx: Any) -> str:
        """The template rendered in ``ctx``; any failure is a :class:`TemplateError`."""
        try:
            return "".join(self._root(ctx))
        except TemplateError:
            raise
        except Exception as exc:  # the sandbox, an undefined variable, a type error in the template
            raise TemplateError(f"the chat template failed: {exc}") from None

    def parent(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """The globals and ``variables``, with no messages yet (:class:`MessagesLoop`)."""
        return {**self._globals, **variables, "messages": ()}


class MessagesLoop:
    """A split template's loop with its variables bound, rendered in one Jinja context kept from
    call to call (building one is about half a render's cost): only its ``messages`` change. What
    a render could leave in a context, none of it can here: the loop is the template's only
    statement, so nothing is set at its top level (``vars``, ``exported_vars``: checked after each
    render all the same), and no block or inheritance is allowed in it; an ``{% autoescape %}``
    reverts the evaluation context when it ends, and a render that fails drops the context."""

    __slots__ = ("_compiled", "_context", "_parent", "_variables")

    def __init__(self, compiled: _Compiled, variables: Mapping[str, Any]) -> None:
        self._compiled = compiled
        self._variables = variables
        self._parent: dict[str, Any] = {}
        self._context: Any = None

    def __call__(self, messages: Sequence[Mapping[str, Any]]) -> str:
        ctx = self._context
        if ctx is None:
            self._parent = self._compiled.parent(self._variables)
            ctx = self._context = self._compiled.context(self._parent)
        parent = self._parent
        parent["messages"] = messages
        try:
            text = self._compiled.run(ctx)
        except TemplateError:
            self._context = None
            raise
        finally:
            parent["messages"] = ()  # (not kept alive by the context)
        if ctx.vars or ctx.exported_vars:
            self._context = None
        return text


_RENDER_ARGS = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


class ChatTemplate:
    """One compiled template and the special tokens it is rendered with; ``split`` where the
    template renders message by message (:class:`SplitTemplate`), else ``None``."""

    __slots__ = ("_template", "source", "special_tokens", "split")

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens)
        env = _environment()
        try:
            self._template = _Compiled(env.from_string(source))
            tree = env.parse(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"the chat template does not compile: {exc}") from None
        at = _separable_loop(tree)
        self.split = SplitTemplate(env, tree, at) if at is not None else None

    @classmethod
    def from_folder(cls, folder: Path, config: Mapping[str, Any]) -> ChatTemplate | None:
        source = load_template_source(folder, config)
        if source is None:
            return None
        special: dict[str, str] = {}
        for name in (
            "bos_token",
            "eos_token",
            "unk_token",
            "pad_token",
            "sep_token",
            "cls_token",
            "mask_token",
        ):
            text = _token_text(config.get(name))
            if text is not None:
                special[name] = text
        return cls(source, special)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Any = None,
        documents: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        kwargs = self.variables(add_generation_prompt, tools, documents, extra)
        text = self._template(kwargs, messages)
        if continue_final_message and messages:
            final = messages[-1].get("content")
            if isinstance(final, str) and final.strip():
                end = text.rfind(final.strip())
                if end >= 0:
                    text = text[: end + len(final.strip())]
        return text

    def variables(
        self, add_generation_prompt: bool, tools: Any, documents: Any, extra: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """What the template is rendered with besides ``messages``."""
        kwargs: dict[str, Any] = dict(self.special_tokens)
        if extra:
            if not _RENDER_ARGS.isdisjoint(extra):
                raise TemplateError(f"chat_template_kwargs may not set {sorted(_RENDER_ARGS & set(extra))}")
            kwargs.update(extra)
        kwargs["tools"] = tools
        kwargs["documents"] = documents
        kwargs["add_generation_prompt"] = add_generation_prompt
        return kwargs
