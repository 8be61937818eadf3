"""Chat templates for GGUF files that carry none, by model family, as llama.cpp falls back to
its built-in ones: a file converted without `tokenizer.chat_template` would otherwise serve
completions only.

Each is the family's published template (Hugging Face `tokenizer_config.json`), text parts only,
and applies only where the vocabulary holds the tokens it writes.
"""

from __future__ import annotations

from collections.abc import Sequence

# Gemma 3's template: a system message is folded into the first user turn, the assistant is
# "model", every turn ends in <end_of_turn>, and the roles must alternate.
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

_BY_FAMILY: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemma3": (GEMMA3, ("<start_of_turn>", "<end_of_turn>")),
}


def family_template(architecture: str, tokens: Sequence[str]) -> str | None:
    """The built-in template of `architecture`, if it has one and the vocabulary holds its
    turn tokens; else None."""
    entry = _BY_FAMILY.get(architecture)
    if entry is None:
        return None
    template, needed = entry
    present = set(needed) & set(tokens)
    return template if present == set(needed) else None
