"""Function calling: tools into the prompt, calls out of the text, and the grammar in between.

The wire format is Hermes' (Qwen 2.5 and most tool-tuned Llama-family models speak it): each
call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` on a line of its own.

- A chat template that reads `tools` renders them itself (and the conversation's tool messages
  and earlier calls). Otherwise `DEFAULT_TOOL_PROMPT` lists them in the system message, earlier
  calls are written back in the wire format, and tool results become user turns wrapped in
  `<tool_response>`.
- `tool_choice`: "none" leaves the tools out of the prompt; "auto" (the default with tools)
  lets the model choose, and calls are parsed from what it writes; "required" and a named
  function constrain the output to calls whose arguments match the functions' parameter
  schemas, so they always parse.

A model with a wire format of its own is read in it where its prompt asks for it: Gemma 4's
`<|tool_call>call:NAME{…}<tool_call|>` (gemma4_format.py; `ToolPlan.wire`). The grammar of
"required" and a named function stays Hermes', and so does the parse of what it constrains.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nanoserve.api.chat import gemma4_format
from nanoserve.api.chat.schemas import (
    FunctionCall,
    FunctionCallDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
)
from nanoserve.api.server.errors import APIError
from nanoserve.runtime import JSON_OPTIONS, GrammarSpec, bounded_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

DEFAULT_TOOL_PROMPT = (
    "You can call functions to answer. The functions, as JSON schemas:\n"
    "<tools>\n{tools}\n</tools>\n"
    "To call a function, write one line per call and nothing else:\n"
    '<tool_call>{{"name": <function name>, "arguments": <arguments as a JSON object>}}'
    "</tool_call>"
)


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a chat request's `tools` and `tool_choice` mean for this answer."""

    tools: tuple[Tool, ...]
    choice: str  # "none" | "auto" | "required" | "function"
    function: str | None  # the named function, for choice "function"
    parallel: bool  # "required" may answer with several calls (only when asked for)
    wire: str = "hermes"  # how the answer writes its calls: a key of WIRES

    @property
    def parses(self) -> bool:
        """Whether the answer's text is searched for calls."""
        return bool(self.tools) and self.choice != "none"

    def tool_dicts(self) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": _function_dict(t)}
            for t in self.tools
            if self.choice != "function" or t.function.name == self.function
        ]

    def grammar(self) -> GrammarSpec | None:
        """For "required" or a named function: calls only, arguments per their schemas. Each
        function is a rule of its own, its schema a `%json` document of its own, so the `$ref`s
        of its parameters (`#/$defs/...`, as Pydantic writes them) resolve in its document."""
        if self.choice not in ("required", "function"):
            return None
        tools = [
            t for t in self.tools if self.choice == "required" or t.function.name == self.function
        ]
        rules = [
            f'call_{i}: "{OPEN}" %json {json.dumps(bounded_schema(_call_schema(t)))} "{CLOSE}"'
            for i, t in enumerate(tools)
        ]
        call = "call: " + " | ".join(f"call_{i}" for i in range(len(tools)))
        start = (
            'start: call ("\\n" call)*'
            if self.parallel and self.choice == "required"
            else "start: call"
        )
        return GrammarSpec("lark", "\n".join([start, call, *rules]) + "\n", source="tools")


def _call_schema(tool: Tool) -> dict[str, Any]:
    """One call's JSON: its name, and its arguments per the parameters' schema, whose
    definitions move to the document's root where their references point."""
    arguments = _closed(tool.function.parameters)
    hoisted = {k: arguments.pop(k) for k in ("$defs", "definitions") if k in arguments}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
        **hoisted,
        "x-guidance": JSON_OPTIONS,
    }


def plan_tools(
    tools: Sequence[Tool] | None, tool_choice: str | dict[str, Any] | None, parallel: bool | None
) -> ToolPlan:
    """Check `tools` and `tool_choice` (a 400 naming the field for each refusal)."""
    tools = tuple(tools or ())
    names = set()
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise APIError(
                400, f"tools[{i}].type must be 'function', got {tool.type!r}", param="tools"
            )
        name = tool.function.name
        if not _NAME.fullmatch(name):
            raise APIError(
                400,
                f"tools[{i}].function.name {name!r} must be 1-64 letters, digits, '_', '.' or '-'",
                param="tools",
            )
        if name in names:
            raise APIError(400, f"tools[{i}]: the function {name!r} is listed twice", param="tools")
        names.add(name)
        params = tool.function.parameters
        if params is not None and params.get("type", "object") != "object":
            raise APIError(
                400, f"tools[{i}].function.parameters must be an object schema", param="tools"
            )
    choice, function = _choice(tool_choice, names, bool(tools))
    # Unset, "required" answers with one call: a small model offered a second call takes it,
    # the same call again, until max_tokens. "auto" parses however many the model writes.
    return ToolPlan(tools, choice, function, bool(parallel))


def _choice(
    tool_choice: str | dict[str, Any] | None, names: set[str], has_tools: bool
) -> tuple[str, str | None]:
    if tool_choice is None:
        return ("auto" if has_tools else "none"), None
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise APIError(
                400,
                f"tool_choice {tool_choice!r} is not 'none', 'auto', 'required' or a function",
                param="tool_choice",
            )
        if tool_choice != "none" and not has_tools:
            raise APIError(400, f"tool_choice {tool_choice!r} needs tools", param="tool_choice")
        return tool_choice, None
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice.get("type") != "function" or not isinstance(name, str):
        raise APIError(
            400,
            'tool_choice must be {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if name not in names:
        raise APIError(
            400, f"tool_choice names {name!r}, which is not in tools", param="tool_choice"
        )
    return "function", name


def _closed(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The arguments' schema as constrained: only the declared parameters, unless the schema
    itself says `additionalProperties` (JSON Schema's default, open, lets a small model pad
    the arguments with keys copied from the tool description)."""
    schema = dict(parameters or {"type": "object", "properties": {}})
    schema.setdefault("additionalProperties", False)
    return schema


def _function_dict(tool: Tool) -> dict[str, Any]:
    f = tool.function
    out: dict[str, Any] = {"name": f.name}
    if f.description is not None:
        out["description"] = f.description
    out["parameters"] = f.parameters or {"type": "object", "properties": {}}
    return out


# -- the prompt ----------------------------------------------------------------------------


def default_tool_prompt(plan: ToolPlan) -> str:
    return DEFAULT_TOOL_PROMPT.format(tools="\n".join(json.dumps(t) for t in plan.tool_dicts()))


def wire_call(name: str, arguments: str) -> str:
    """An earlier call written back in the wire format (arguments as sent: JSON text)."""
    try:
        args: Any = json.loads(arguments)
    except json.JSONDecodeError:
        args = arguments
    return f"{OPEN}{json.dumps({'name': name, 'arguments': args})}{CLOSE}"


# -- the answer ----------------------------------------------------------------------------


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_call(body: str, names: set[str]) -> FunctionCall | None:
    """One `<tool_call>` body as a call, or None when it is not one of ours."""
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError):  # the model's text: anything at all
        return None
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return FunctionCall(name=value["name"], arguments=json.dumps(arguments, ensure_ascii=False))


@dataclass(frozen=True, slots=True)
class WireFormat:
    """How an answer writes its calls: each between `open` and `close`, its body read by
    `parse` (None: not one of the request's functions, so it stays text)."""

    open: str
    close: str
    parse: Callable[[str, set[str]], FunctionCall | None]
    pattern: re.Pattern[str]  # a whole call, its body the group

    @classmethod
    def of(
        cls, open: str, close: str, parse: Callable[[str, set[str]], FunctionCall | None]
    ) -> WireFormat:
        body = re.escape(open) + r"\s*(.*?)\s*" + re.escape(close)
        return cls(open, close, parse, re.compile(body, re.DOTALL))


WIRES = {
    "hermes": WireFormat.of(OPEN, CLOSE, parse_call),
    "gemma4": WireFormat.of(*gemma4_format.CALL, gemma4_format.parse_gemma4_call),
}


def parse_tool_calls(text: str, plan: ToolPlan) -> tuple[str | None, list[ToolCall]]:
    """(the text outside the calls, or None when only calls remain; the calls)."""
    names = {t.function.name for t in plan.tools}
    wire = WIRES[plan.wire]
    calls: list[ToolCall] = []
    kept: list[str] = []
    at = 0
    for match in wire.pattern.finditer(text):
        call = wire.parse(match.group(1), names)
        if call is None:
            continue  # not ours: it stays in the content
        kept.append(text[at : match.start()])
        at = match.end()
        while text[at : at + 1] == "\n":  # the line break after a call is not content
            at += 1
        calls.append(ToolCall(id=new_call_id(), function=call))
    kept.append(text[at:])
    content = "".join(kept)
    if calls and not content.strip():
        return None, calls
    return content, calls


class ToolCallStream:
    """Streamed text -> content pieces and tool-call deltas, for one choice.

    Text that may be the start of a call (`<tool_call>`, or its wire's mark) is held back until it is known not to be; a
    call's text is held until its `</tool_call>`, then sent as two deltas in OpenAI's shape: one
    naming the call (index, id, type, name, empty arguments), one with its arguments."""

    def __init__(self, plan: ToolPlan) -> None:
        self._names = {t.function.name for t in plan.tools}
        self._wire = WIRES[plan.wire]
        self._buffer = ""
        self.num_calls = 0
        self._after_call = False  # the newline that separates calls is not content
        self._held = ""  # leading whitespace, not yet known to be content
        self._spoke = False  # whether non-whitespace content has been sent

    def push(self, text: str, *, final: bool = False) -> tuple[str, list[ToolCallDelta]]:
        content, deltas = self._push(text, final=final)
        # Until some content is more than whitespace it is held: an answer of calls and
        # whitespace has no content at all (as `parse_tool_calls` says, content None).
        if not self._spoke:
            self._held += content
            content = ""
            if self._held.strip():
                content, self._held, self._spoke = self._held, "", True
            elif final:
                content = "" if self.num_calls else self._held
        return content, deltas

    def _push(self, text: str, *, final: bool) -> tuple[str, list[ToolCallDelta]]:
        self._buffer += text
        if self._after_call and self._buffer:
            self._buffer = self._buffer.lstrip("\n")
            self._after_call = not self._buffer
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        opening, closing = self._wire.open, self._wire.close
        while self._buffer:
            start = self._buffer.find(opening)
            if start < 0:
                keep = 0 if final else _partial_open(self._buffer, opening)
                content.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            end = self._buffer.find(closing, start)
            if end < 0:
                if final:
                    content.append(self._buffer)
                    self._buffer = ""
                else:
                    content.append(self._buffer[:start])
                    self._buffer = self._buffer[start:]
                break
            call = self._wire.parse(self._buffer[start + len(opening) : end].strip(), self._names)
            stop = end + len(closing)
            if call is None:
                content.append(self._buffer[:stop])
            else:
                content.append(self._buffer[:start])
                deltas += call_deltas(self.num_calls, call)
                self.num_calls += 1
                self._after_call = True
            self._buffer = self._buffer[stop:]
            if self._after_call:
                self._buffer = self._buffer.lstrip("\n")
                self._after_call = not self._buffer
        return "".join(content), deltas


def whole_calls(deltas: Sequence[ToolCallDelta]) -> list[ToolCall]:
    """Whole calls from deltas in `call_deltas`' pairs: the call's id and name, then its
    arguments."""
    calls = []
    for head, body in zip(deltas[::2], deltas[1::2], strict=True):
        assert head.id is not None and head.function is not None and body.function is not None
        name, arguments = head.function.name or "", body.function.arguments or ""
        calls.append(ToolCall(id=head.id, function=FunctionCall(name=name, arguments=arguments)))
    return calls


def call_deltas(index: int, call: FunctionCall) -> list[ToolCallDelta]:
    """A whole call as OpenAI streams one: a delta naming it (index, id, type, name, empty
    arguments), then one with its arguments."""
    return [
        ToolCallDelta(
            index=index,
            id=new_call_id(),
            type="function",
            function=FunctionCallDelta(name=call.name, arguments=""),
        ),
        ToolCallDelta(index=index, function=FunctionCallDelta(arguments=call.arguments)),
    ]


def _partial_open(text: str, opening: str = OPEN) -> int:
    """Length of the longest suffix of text that is a proper prefix of `opening`."""
    for size in range(min(len(opening) - 1, len(text)), 0, -1):
        if text.endswith(opening[:size]):
            return size
    return 0
