"""Render a model's chat template (Jinja) into prompt text, as transformers does, in a sandbox.

Chat templates come with downloaded models, so they are untrusted code. They run in Jinja's
`ImmutableSandboxedEnvironment`, with one change: touching an unsafe attribute (`__class__`,
`__subclasses__`, ...) raises at once instead of quietly rendering as an empty string, so a template
that probes the sandbox fails with `ChatTemplateError` rather than half-working.

The environment otherwise matches transformers' `apply_chat_template` (trim_blocks, lstrip_blocks,
loopcontrols, `{% generation %}`, its `tojson`, `raise_exception`, `strftime_now`, `dict` and
`namespace`), so the
prompt text is identical to what the model was trained and evaluated with.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, Protocol

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from nanoserve.runtime.errors import ChatTemplateError
from nanoserve.runtime.text.tokenizer import Tokenizer

Message = Mapping[str, Any]


class TemplateSource(Protocol):
    """Where a template comes from (a loaded checkpoint): its text, tokenizer and path."""

    @property
    def chat_template(self) -> str | None: ...
    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def path(self) -> Path: ...


# Bounds on what a template may build (the stock sandbox bounds range() alone): a prompt, not a
# bomb. A template comes with the model, not from clients, but a model repository is not trusted.
MAX_PRODUCT_LEN = 1 << 20  # items of a `text * n` or `list * n`
MAX_INT_BITS = 4096  # of an integer `a * b` or `a ** b`: (10**256)**256 would hold the thread
MAX_RENDER_CHARS = 16 << 20  # of the whole output


class ChatTemplate:
    """One compiled chat template, and the special-token strings templates may refer to."""

    __slots__ = ("_special_tokens", "_template", "reads_tools", "source", "text")

    def __init__(
        self,
        text: str | None,
        *,
        source: str | os.PathLike[str],
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.source = os.fspath(source)
        if not text:
            raise ChatTemplateError(self.source, "the model has no chat template")
        self.text = text
        self._special_tokens = dict(special_tokens or {})  # bos_token, eos_token, ...
        try:
            self._template = _ENVIRONMENT.from_string(text)
            # Whether the template renders `tools` itself (Hugging Face's convention for
            # function calling); a template that never reads them gets nanoserve's tool prompt.
            self.reads_tools = "tools" in jinja2.meta.find_undeclared_variables(
                _ENVIRONMENT.parse(text)
            )
        except TemplateSyntaxError as error:
            raise ChatTemplateError(
                self.source, f"chat template syntax error at line {error.lineno}: {error.message}"
            ) from None

    @property
    def thinks(self) -> bool:
        """Whether the template writes reasoning in <think>…</think> (Qwen3, SmolLM3): the
        server then splits an answer's reasoning from its content."""
        return "<think>" in self.text and "</think>" in self.text

    @classmethod
    def from_checkpoint(cls, checkpoint: TemplateSource) -> ChatTemplate:
        tokenizer = checkpoint.tokenizer
        special = {
            "bos_token": tokenizer.id_to_token(tokenizer.bos_token_id)
            if tokenizer.bos_token_id is not None
            else None,
            "eos_token": tokenizer.id_to_token(tokenizer.eos_token_ids[0])
            if tokenizer.eos_token_ids
            else None,
        }
        return cls(
            checkpoint.chat_template,
            source=checkpoint.path,
            special_tokens={k: v for k, v in special.items() if v is not None},
        )

    def _render_bounded(self, context: dict[str, Any]) -> str:
        """The template's output, chunk by chunk, refused once past MAX_RENDER_CHARS: a loop
        of big strings fails after a few, not after filling the memory."""
        chunks, size = [], 0
        for chunk in self._template.generate(context):
            size += len(chunk)
            if size > MAX_RENDER_CHARS:
                raise SecurityError(
                    f"the output passed the sandbox's {MAX_RENDER_CHARS} characters"
                )
            chunks.append(chunk)
        return "".join(chunks)

    def render(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """The prompt text for `messages` (`[{"role": ..., "content": ...}, ...]`).

        `extra` reaches the template as variables (`tools`, `enable_thinking`, ...), overriding the
        special-token names; with `add_generation_prompt` the text ends where the reply begins.
        """
        context = {
            **self._special_tokens,
            **extra,
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._render_bounded(context)
        except SecurityError as error:
            raise ChatTemplateError(
                self.source, f"chat template tried to escape its sandbox: {error}"
            ) from None
        except TemplateError as error:  # raise_exception(...) and undefined-variable errors
            raise ChatTemplateError(self.source, f"chat template failed: {error}") from None
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as error:
            raise ChatTemplateError(
                self.source, f"chat template failed: {type(error).__name__}: {error}"
            ) from None


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """The stock immutable sandbox, except that an unsafe attribute raises rather than rendering
    '', and that `*` and `**` are bounded."""

    intercepted_binops = frozenset({"*", "**"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} is unsafe"
        )

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if isinstance(left, int) and isinstance(right, int):
            if operator == "**":  # the result's bits: b * log2|a|
                bits = abs(right) * math.log2(abs(left)) if abs(left) > 1 else 0.0
            else:
                bits = left.bit_length() + right.bit_length()
            if bits > MAX_INT_BITS:
                raise SecurityError(
                    f"{left.bit_length()}-bit {operator} {right.bit_length()}-bit integers is"
                    f" past the sandbox's {MAX_INT_BITS} bits"
                )
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(times, int)
                    and len(seq) * times > MAX_PRODUCT_LEN
                ):
                    raise SecurityError(
                        f"{len(seq)} items times {times} is past the sandbox's {MAX_PRODUCT_LEN}"
                    )
        return super().call_binop(context, operator, left, right)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant text with it for
    training masks; rendering only needs the body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares a set)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' version: Jinja's own `tojson` HTML-escapes `<`, `>` and `&`, which a prompt must not.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` for templates, without exposing the `dict` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """Jinja's `namespace`, refusing underscore names (a way to reach interpreter internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick, so `self=` works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"namespace attribute {name!r} starts with an underscore")


def _environment() -> jinja2.Environment:
    env = _StrictSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


# One environment for all templates: compiling is per template, the environment holds no state.
_ENVIRONMENT = _environment()
