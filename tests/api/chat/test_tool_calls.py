"""tool_calls: the Hermes wire format parsed whole and streamed, and the grammar it implies."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.api.chat.schemas import FunctionDefinition, Tool
from nanoserve.api.chat.tool_calls import ToolCallStream, parse_tool_calls, plan_tools

TOOLS = [
    Tool(type="function", function=FunctionDefinition(name="add", parameters={"type": "object"})),
    Tool(type="function", function=FunctionDefinition(name="sub")),
]
PLAN = plan_tools(TOOLS, "auto", None)
ADD = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
SUB_AS_TEXT = '<tool_call>{"name": "sub", "arguments": "{\\"x\\": 3}"}</tool_call>'


def test_whole_text_calls_and_content() -> None:
    content, calls = parse_tool_calls(f"ok {ADD}\n{SUB_AS_TEXT}\n", PLAN)
    assert content == "ok "
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("add", {"a": 1, "b": 2}),
        ("sub", {"x": 3}),  # arguments sent as JSON text are accepted
    ]
    assert len({c.id for c in calls}) == 2


def test_only_calls_means_no_content() -> None:
    assert parse_tool_calls(ADD, PLAN)[0] is None


def test_malformed_and_unknown_calls_stay_text() -> None:
    text = '<tool_call>{"name": "add", "arguments": [1]}</tool_call> <tool_call>{nope</tool_call>'
    assert parse_tool_calls(text, PLAN) == (text, [])


def test_stream_holds_back_only_what_may_open_a_call() -> None:
    stream = ToolCallStream(PLAN)
    assert stream.push("a < b <tool") == ("a < b ", [])
    assert stream.push("s>") == ("<tools>", [])  # not a call after all
    text, deltas = stream.push(ADD)
    assert text == "" and [d.index for d in deltas] == [0, 0]
    assert deltas[0].function is not None and deltas[1].function is not None
    assert deltas[0].function.name == "add" and deltas[0].function.arguments == ""
    assert json.loads(deltas[1].function.arguments or "") == {"a": 1, "b": 2}
    assert stream.push("<tool_call>{", final=True) == ("<tool_call>{", [])  # cut off: text


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(
        st.sampled_from(["hi ", ADD, "\n", SUB_AS_TEXT, "<", "<tool", " x"]), max_size=6
    ),
    data=st.data(),
)
def test_any_split_of_a_stream_gives_the_whole_answer(pieces: list[str], data) -> None:
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    stream = ToolCallStream(PLAN)
    content, args = "", []
    for i, part in enumerate(parts):
        piece, deltas = stream.push(part, final=i == len(parts) - 1)
        content += piece
        args += [
            (d.index, d.function.arguments)
            for d in deltas
            if d.function is not None and d.function.name is None
        ]
    whole_content, calls = parse_tool_calls(text, PLAN)
    assert content == (whole_content or "")
    assert args == [(i, c.function.arguments) for i, c in enumerate(calls)]


def test_required_with_several_tools_is_any_of_their_calls() -> None:
    grammar = plan_tools(TOOLS, "required", None).grammar()
    assert grammar is not None and grammar.text.startswith("start: call\n")
    assert "call: call_0 | call_1\n" in grammar.text and '"const": "sub"' in grammar.text
    assert plan_tools(TOOLS, "auto", None).grammar() is None


def test_a_call_name_that_is_not_a_string_is_text() -> None:
    text = '<tool_call>{"name": ["add"], "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, PLAN) == (text, [])
    deep = "<tool_call>" + "[" * 100_000 + "</tool_call>"
    assert parse_tool_calls(deep, PLAN) == (deep, [])


def test_parameters_with_defs_move_to_the_root() -> None:
    """$defs move to the root of the call's document, where `#/$defs/...` points."""
    params = {
        "type": "object",
        "properties": {"where": {"$ref": "#/$defs/Place"}},
        "required": ["where"],
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }
    tool = Tool(type="function", function=FunctionDefinition(name="go", parameters=params))
    grammar = plan_tools([tool], "required", None).grammar()
    assert grammar is not None
    body = grammar.text.split("%json ", 1)[1].rsplit(' "</tool_call>"', 1)[0]
    document = json.loads(body)
    assert document["$defs"] == params["$defs"]
    assert "$defs" not in document["properties"]["arguments"]


def test_the_required_grammar_compiles_and_takes_a_call_with_refs() -> None:
    """On the embedded model's tokenizer, llguidance compiles the tool grammar and accepts a call
    whose arguments go through a `$ref`."""
    from nanoserve.runtime.loading.checkpoint import load_checkpoint
    from nanoserve.runtime.loading.embedded import embedded_model_path
    from nanoserve.runtime.structured.grammar_compiler import GrammarCompiler

    tokenizer = load_checkpoint(embedded_model_path()).tokenizer
    params = {
        "type": "object",
        "properties": {"where": {"$ref": "#/$defs/Place"}},
        "required": ["where"],
        "$defs": {
            "Place": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            }
        },
    }
    tools = [
        *TOOLS,
        Tool(type="function", function=FunctionDefinition(name="go", parameters=params)),
    ]
    grammar = plan_tools(tools, "required", True).grammar()
    assert grammar is not None
    matcher = GrammarCompiler(tokenizer, vocab_size=49152, eos_token_ids=[2]).matcher(grammar)
    text = (
        '<tool_call>{"name": "go", "arguments": {"where": {"city": "Oslo"}}}</tool_call>\n'
        '<tool_call>{"name": "sub", "arguments": {}}</tool_call>'
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert matcher.try_consume_tokens(ids) == len(ids)
    assert matcher.is_accepting()
    bad = tokenizer.encode(
        '<tool_call>{"name": "go", "arguments": {"where": 1', add_special_tokens=False
    )
    assert GrammarCompiler(tokenizer, vocab_size=49152, eos_token_ids=[2]).matcher(
        grammar
    ).try_consume_tokens(bad) < len(bad)
