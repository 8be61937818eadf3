"""Built-in templates for GGUF files without one: Gemma 3's, where its turn tokens exist."""

from __future__ import annotations

from typing import Any

import pytest

from nanoserve.runtime.errors import ChatTemplateError
from nanoserve.runtime.text.chat_template import ChatTemplate
from nanoserve.runtime.text.family_templates import GEMMA3, family_template

TURN_TOKENS = ["<bos>", "<start_of_turn>", "<end_of_turn>", "a"]


def test_only_a_family_with_its_turn_tokens_gets_one() -> None:
    assert family_template("gemma3", TURN_TOKENS) == GEMMA3
    assert family_template("gemma3", ["<bos>", "<start_of_turn>"]) is None
    assert family_template("llama", TURN_TOKENS) is None


def gemma(messages: list[dict[str, str]], **extra: Any) -> str:
    template = ChatTemplate(GEMMA3, source="gemma3", special_tokens={"bos_token": "<bos>"})
    return template.render(messages, **extra)


def test_gemma3_turns_a_system_message_and_the_model_role() -> None:
    text = gemma(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ]
    )
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    no_prompt = gemma([{"role": "user", "content": "x"}], add_generation_prompt=False)
    assert no_prompt == "<bos><start_of_turn>user\nx<end_of_turn>\n"


def test_gemma3_refuses_roles_that_do_not_alternate() -> None:
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        gemma([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
