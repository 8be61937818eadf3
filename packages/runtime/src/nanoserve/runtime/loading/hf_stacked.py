"""Experts a Hugging Face checkpoint stores stacked, one tensor for all of a layer's experts,
presented to the loader as one tensor per expert (`mlp.experts.{e}.gate_proj.weight`), each read
as a slice of the stacked tensor from the memory map: no stacked copy is ever made.

Three stacked forms are read:
- Granite 4.0-H's: `block_sparse_moe.input_linear.weight` [experts, 2 * width, hidden] (each
  expert's gate rows, then its up rows), `block_sparse_moe.output_linear.weight`
  [experts, hidden, width] (down);
- transformers 5's own, as its modules hold them (a checkpoint saved without its per-expert
  conversion): `mlp.experts.gate_up_proj` [experts, 2 * width, hidden] and
  `mlp.experts.down_proj` [experts, hidden, width];
- gpt-oss's, transposed (x @ W) with gate and up interleaved by column:
  `mlp.experts.gate_up_proj` [experts, hidden, 2 * width] (gate = columns 0::2, up = 1::2),
  `gate_up_proj_bias` [experts, 2 * width] (the same), `down_proj` [experts, width, hidden],
  `down_proj_bias` [experts, hidden].

Gemma 4's are transformers' own form, stored outside `mlp.` (`layers.3.experts.gate_up_proj`),
and matched by the loader's name for them.

Converting back to a directory (`nanoserve convert`) writes Granite's, gpt-oss's and Gemma 4's
stacked forms again, since transformers reads their experts in no other (`stacked_shapes`,
`stacked_values`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

# A stacked tensor's name: (layer prefix, which stack); `gate_up` holds gate then up rows
_STACKED = {
    "granitemoehybrid": re.compile(
        r"(model\.layers\.\d+)\.block_sparse_moe\.(input|output)_linear\.weight"
    ),
}
_TRANSFORMERS = re.compile(r"(model\.layers\.\d+)\.mlp\.experts\.(gate_up|down)_proj")
_GATE_UP = ("input", "gate_up")
_EXPERT = re.compile(
    r"(model\.layers\.\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.(weight|bias)"
)
GRANITE_STACKS = {"gate_up": "block_sparse_moe.input_linear.weight",
                  "down": "block_sparse_moe.output_linear.weight"}  # fmt: skip


_GPT_OSS = re.compile(r"(model\.layers\.\d+)\.mlp\.experts\.(gate_up|down)_proj(_bias)?")


@dataclass(frozen=True, slots=True)
class StackedPart:
    """One expert's linear (or bias) within a stacked tensor: `stored[expert]`, transposed if
    stored so, then its rows `start:stop:step`."""

    stored: str  # the file's tensor name
    expert: int
    start: int
    stop: int
    step: int = 1  # 2: every other row (gpt-oss's interleaved gate and up)
    transposed: bool = False  # stored [in, out] (gpt-oss's x @ W)

    def read(self, handle: object) -> torch.Tensor:
        """This part from a safetensors handle (`safe_open`), reading only its expert's bytes."""
        whole = handle.get_slice(self.stored)[self.expert]  # type: ignore[attr-defined]
        if self.transposed:
            whole = whole.T
        if (self.start, self.stop, self.step) == (0, whole.shape[0], 1):
            return whole.contiguous()
        return whole[self.start : self.stop : self.step].contiguous()


def stacked_parts(
    arch: str, stored: str, shape: tuple[int, ...], known: str | None = None
) -> dict[str, tuple[StackedPart, tuple[int, ...]]] | None:
    """The per-expert linears a stored tensor holds, by the loader's name, each with its shape;
    None for a tensor that is not a stack of experts. `known`: the loader's name for the stored
    one (Gemma 4's `model.language_model.layers.3.experts.gate_up_proj` is
    `model.layers.3.mlp.experts.gate_up_proj`, transformers' own form)."""
    if arch == "gpt_oss":
        return _gpt_oss_parts(stored, shape)
    pattern, name = _STACKED.get(arch), known or stored
    match = (pattern.fullmatch(stored) if pattern else None) or _TRANSFORMERS.fullmatch(name)
    if match is None or len(shape) != 3:
        return None
    prefix, stack = match.groups()
    experts, rows, cols = shape
    parts: dict[str, tuple[StackedPart, tuple[int, ...]]] = {}
    for e in range(experts):
        name = f"{prefix}.mlp.experts.{e}.{{}}_proj.weight"
        if stack in _GATE_UP:
            half = rows // 2
            parts[name.format("gate")] = (StackedPart(stored, e, 0, half), (half, cols))
            parts[name.format("up")] = (StackedPart(stored, e, half, rows), (half, cols))
        else:
            parts[name.format("down")] = (StackedPart(stored, e, 0, rows), (rows, cols))
    return parts


def _gpt_oss_parts(
    stored: str, shape: tuple[int, ...]
) -> dict[str, tuple[StackedPart, tuple[int, ...]]] | None:
    match = _GPT_OSS.fullmatch(stored)
    if match is None or len(shape) != (2 if match[3] else 3):
        return None
    prefix, stack, bias = match.groups()
    kind = "bias" if bias else "weight"
    experts, *rest = shape
    parts: dict[str, tuple[StackedPart, tuple[int, ...]]] = {}
    for e in range(experts):
        name = f"{prefix}.mlp.experts.{e}.{{}}_proj.{kind}"
        if bias:  # [2 * width] interleaved, or [hidden]
            rows, cols = rest[0], None
        else:  # stored [in, out]: read as [out, in]
            cols, rows = rest
        tail = () if cols is None else (cols,)
        if stack == "gate_up":
            half = rows // 2
            for which, first in (("gate", 0), ("up", 1)):
                part = StackedPart(stored, e, first, rows, 2, transposed=not bias)
                parts[name.format(which)] = (part, (half, *tail))
        else:
            part = StackedPart(stored, e, 0, rows, 1, transposed=not bias)
            parts[name.format("down")] = (part, (rows, *tail))
    return parts


def _interleaved(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate's rows at the even places, up's at the odd (gpt-oss's order)."""
    return torch.stack((gate, up), dim=1).reshape(-1, *gate.shape[1:])


def _stacks(
    arch: str, prefix: str, held: Mapping[str, list[torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """A layer's expert tensors (by part and kind: `gate.weight`: one per expert) as the
    family's stacks."""
    pairs = zip(held["gate.weight"], held["up.weight"], strict=True)
    if arch == "gemma4":  # transformers' own stacks (family_name moves them out of `mlp.`)
        return [
            (f"{prefix}.mlp.experts.gate_up_proj", torch.stack([torch.cat(p) for p in pairs])),
            (f"{prefix}.mlp.experts.down_proj", torch.stack(held["down.weight"])),
        ]
    if arch == "gpt_oss":
        out = [
            (f"{prefix}.mlp.experts.gate_up_proj",
             torch.stack([_interleaved(g, u).T for g, u in pairs])),
            (f"{prefix}.mlp.experts.down_proj", torch.stack([d.T for d in held["down.weight"]])),
        ]  # fmt: skip
        if held.get("gate.bias"):
            biases = zip(held["gate.bias"], held["up.bias"], strict=True)
            out.insert(1, (f"{prefix}.mlp.experts.gate_up_proj_bias",
                           torch.stack([_interleaved(g, u) for g, u in biases])))  # fmt: skip
            out.append((f"{prefix}.mlp.experts.down_proj_bias", torch.stack(held["down.bias"])))
        return out
    return [
        (f"{prefix}.{GRANITE_STACKS['gate_up']}", torch.stack([torch.cat(p) for p in pairs])),
        (f"{prefix}.{GRANITE_STACKS['down']}", torch.stack(held["down.weight"])),
    ]


def _layer_ends(names: Iterable[str]) -> dict[str, str]:
    """Each layer's last expert tensor (where its stacks are written) -> the layer's prefix."""
    last: dict[str, str] = {}
    for name in names:
        if match := _EXPERT.fullmatch(name):
            last[match[1]] = name
    return {name: prefix for prefix, name in last.items()}


def stacked_values(
    arch: str,
    values: Iterable[tuple[str, torch.Tensor]],
    shapes: Mapping[str, tuple[int, ...]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors in `stacked_shapes`' order: a layer's expert tensors held until its last,
    then yielded as the family's stacks (Granite's, gpt-oss's)."""
    ends = _layer_ends(shapes)
    held: dict[str, list[torch.Tensor]] = {}
    for name, value in values:
        if (match := _EXPERT.fullmatch(name)) is None:
            yield name, value
            continue
        held.setdefault(f"{match[3]}.{match[4]}", []).append(value)
        if name in ends:
            yield from _stacks(arch, ends[name], held)
            held = {}


def stacked_shapes(arch: str, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """`shapes` with each layer's expert tensors as the family's stacks, where the last was."""
    meta = ((name, torch.empty(shape, device="meta")) for name, shape in shapes.items())
    return {name: tuple(t.shape) for name, t in stacked_values(arch, meta, shapes)}
