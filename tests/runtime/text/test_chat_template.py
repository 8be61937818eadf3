from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from nanoserve.runtime.errors import ChatTemplateError
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.text.chat_template import ChatTemplate

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "Und auf Deutsch? 🤔"},
]
NO_SYSTEM = CONVERSATION[1:]


def _render(template: str, messages: list[dict[str, Any]] | None = None, **extra: Any) -> str:
    return ChatTemplate(template, source="t.jinja").render(messages or [], **extra)


@pytest.fixture(scope="module")
def tiny_template(tiny_llama_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_checkpoint(load_checkpoint(tiny_llama_dir))


def test_tiny_chatml_prompt(tiny_template: ChatTemplate) -> None:
    assert tiny_template.render(CONVERSATION) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n4.<|im_end|>\n"
        "<|im_start|>user\nUnd auf Deutsch? 🤔<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tiny_template.render(NO_SYSTEM[:1], add_generation_prompt=False) == (
        "<|im_start|>system\nYou are tiny.<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
    )


@pytest.mark.parametrize("messages", [CONVERSATION, NO_SYSTEM])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_tiny_prompt_matches_transformers(
    tiny_llama_dir: Path,
    tiny_template: ChatTemplate,
    messages: list[dict[str, str]],
    add_generation_prompt: bool,
) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(tiny_llama_dir).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert tiny_template.render(messages, add_generation_prompt=add_generation_prompt) == reference


def test_special_tokens_and_extra_variables_reach_the_template(tiny_template: ChatTemplate) -> None:
    template = ChatTemplate(
        "{{ bos_token }}|{{ eos_token }}|{{ tools | length }}|{{ add_generation_prompt }}",
        source="t",
        special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
    )
    assert template.render([], tools=[1, 2]) == "<s>|</s>|2|True"
    assert (
        template.render([], add_generation_prompt=False, bos_token="[B]", tools=[])
        == "[B]|</s>|0|False"
    )


def test_trim_blocks_and_lstrip_blocks() -> None:
    # a block tag's own line, indentation and newline included, leaves nothing behind
    template = (
        "{% for m in messages %}\n  {% if m.role %}\n[{{ m.role }}]\n  {% endif %}\n{% endfor %}"
    )
    assert _render(template, NO_SYSTEM[:2]) == "[user]\n[assistant]\n"


def test_loopcontrols() -> None:
    template = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
    assert _render(template, NO_SYSTEM) == "user"


def test_tojson_is_transformers_version() -> None:
    # no HTML escaping, non-ASCII kept, json.dumps' keyword arguments
    assert _render("{{ {'a': '<b> & ü'} | tojson }}") == '{"a": "<b> & ü"}'
    assert _render("{{ [1, 2] | tojson(indent=2) }}") == "[\n  1,\n  2\n]"


def test_namespace_dict_strftime_and_generation_tag() -> None:
    count = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
    )
    assert _render(count + "{{ ns.n }}", NO_SYSTEM) == "3"
    assert _render("{{ dict(a=1)['a'] }}") == "1"
    assert re.fullmatch(r"\d{4}", _render("{{ strftime_now('%Y') }}"))
    assert _render("{% generation %}x{% endgeneration %}y") == "xy"


def test_a_range_past_the_sandbox_bound_is_a_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError, match=r"^t.jinja: chat template failed: OverflowError"):
        _render("{% for i in range(10**9) %}{% endfor %}")


def test_bounded_products_still_render() -> None:
    assert _render("{{ '-' * 3 }}{{ 2 ** 10 }}{{ [1] * 2 }}{{ 3 * 4 }}") == "---1024[1, 1]12"
    assert _render("{{ 2 ** 4000 }}") == str(2**4000)


def test_raise_exception_becomes_chat_template_error() -> None:
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    with pytest.raises(
        ChatTemplateError, match=r"^t.jinja: chat template failed: first must be user$"
    ):
        _render(template, CONVERSATION)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ ''.__class__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ messages.__class__.__base__ }}",
        "{{ raise_exception.__globals__ }}",
        "{% set ns = namespace(_secret=1) %}",
        "{{ messages.append(1) }}",  # the environment is immutable
        "{{ dict.__call__.__globals__ }}",
        # The known escapes beyond attribute access, each a way round the stock checks:
        "{{ lipsum.__globals__ }}",  # Jinja's own globals are functions too
        "{{ joiner.__init__.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ ''|attr('__class__') }}",  # the attr filter
        "{{ ''|attr('\\x5f\\x5fclass\\x5f\\x5f') }}",  # the name escaped
        "{{ '{0.__class__}'.format('') }}",  # str.format's own attribute lookup
        "{{ messages|map(attribute='__class__')|list }}",
        "{{ self.__init__.__globals__ }}",
        "{{ self._TemplateReference__context }}",
        "{{ messages[0].__getitem__.__self__ }}",
        "{{ strftime_now.__globals__ }}",
        "{{ raise_exception.__code__ }}",
        "{% set x = messages.pop() %}",
        # Resource bombs: the stock sandbox bounds range(); these are bounded here.
        "{{ 'a' * 10**7 }}",
        "{{ [0] * 2000000 }}",
        "{{ 10 ** 1000000000 }}",
        "{{ ((10 ** 256) ** 256) ** 256 }}",  # each step's exponent is small
        "{% set ns = namespace(x=10**300) %}{% for i in range(30) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
        "{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}",  # 100 GB, a chunk at a time
    ],
)
def test_sandbox_escape_is_refused(template: str) -> None:
    with pytest.raises(ChatTemplateError) as caught:
        _render(template, NO_SYSTEM)
    assert str(caught.value).startswith("t.jinja: chat template tried to escape its sandbox: ")


def test_missing_template(tiny_llama_dir: Path) -> None:
    checkpoint = dataclasses.replace(load_checkpoint(tiny_llama_dir), chat_template=None)
    with pytest.raises(
        ChatTemplateError,
        match=f"^{re.escape(str(tiny_llama_dir))}: the model has no chat template$",
    ):
        ChatTemplate.from_checkpoint(checkpoint)


def test_syntax_error_is_reported_with_its_line() -> None:
    with pytest.raises(
        ChatTemplateError, match=r"^t.jinja: chat template syntax error at line 2: "
    ):
        ChatTemplate("ok\n{% for m in messages %}", source="t.jinja")


@pytest.mark.slow
@pytest.mark.parametrize("messages", [CONVERSATION, NO_SYSTEM])
def test_embedded_prompt_matches_transformers(
    embedded_checkpoint: Checkpoint, hf_reference_tokenizer: Any, messages: list[dict[str, str]]
) -> None:
    ours = ChatTemplate.from_checkpoint(embedded_checkpoint).render(
        messages, add_generation_prompt=True
    )
    reference = hf_reference_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert ours == reference
    assert ours.endswith("<|im_start|>assistant\n")
    if messages is NO_SYSTEM:  # SmolLM2's template supplies a default system prompt
        assert ours.startswith(
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        )
