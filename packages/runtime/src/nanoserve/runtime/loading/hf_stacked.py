"""Experts a Hugging Face checkpoint stores stacked, one tensor for all of a layer's experts,
presented to the loader as one tensor per expert (`mlp.experts.{e}.gate_proj.weight`), each read
as a slice of the stacked tensor from the memory map: no stacked copy is ever made.

Two stacked forms are read:
- Granite 4.0-H's: `block_sparse_moe.input_linear.weight` [experts, 2 * width, hidden] (each
  expert's gate rows, then its up rows), `block_sparse_moe.output_linear.weight`
  [experts, hidden, width] (down);
- transformers 5's own, as its modules hold them (a checkpoint saved without its per-expert
  conversion): `mlp.experts.gate_up_proj` [experts, 2 * width, hidden] and
  `mlp.experts.down_proj` [experts, hidden, width].

Converting back to a directory (`nanoserve convert`) writes Granite's stacked form again, since
transformers reads Granite's experts in no other form (`stacked_shapes`, `stacked_values`).
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
_EXPERT = re.compile(r"(model\.layers\.\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
GRANITE_STACKS = {"gate_up": "block_sparse_moe.input_linear.weight",
                  "down": "block_sparse_moe.output_linear.weight"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class StackedPart:
    """One expert's linear within a stacked tensor: `stored[expert, start:stop]`."""

    stored: str  # the file's tensor name
    expert: int
    start: int
    stop: int

    def read(self, handle: object) -> torch.Tensor:
        """This part from a safetensors handle (`safe_open`), reading only its bytes."""
        return handle.get_slice(self.stored)[self.expert, self.start : self.stop]  # type: ignore[attr-defined]


def stacked_parts(
    arch: str, stored: str, shape: tuple[int, ...]
) -> dict[str, tuple[StackedPart, tuple[int, ...]]] | None:
    """The per-expert linears a stored tensor holds, by the loader's name, each with its shape;
    None for a tensor that is not a stack of experts."""
    pattern = _STACKED.get(arch)
    match = (pattern.fullmatch(stored) if pattern else None) or _TRANSFORMERS.fullmatch(stored)
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


def _last_down(name: str, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """The layer prefix when `name` is its last expert's down projection (where the stacks go)."""
    match = _EXPERT.fullmatch(name)
    if match is None or match[3] != "down":
        return None
    following = f"{match[1]}.mlp.experts.{int(match[2]) + 1}.down_proj.weight"
    return None if following in shapes else match[1]


def stacked_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """`shapes` with each layer's expert linears as Granite's two stacks, where the last was."""
    out: dict[str, tuple[int, ...]] = {}
    counts: dict[str, int] = {}
    for name, shape in shapes.items():
        if (match := _EXPERT.fullmatch(name)) is None:
            out[name] = shape
            continue
        counts[match[1]] = max(counts.get(match[1], 0), int(match[2]) + 1)
        if (prefix := _last_down(name, shapes)) is not None:
            experts = counts[prefix]
            width = shape[1]
            hidden = shape[0]
            out[f"{prefix}.{GRANITE_STACKS['gate_up']}"] = (experts, 2 * width, hidden)
            out[f"{prefix}.{GRANITE_STACKS['down']}"] = (experts, hidden, width)
    return out


def stacked_values(
    values: Iterable[tuple[str, torch.Tensor]], shapes: Mapping[str, tuple[int, ...]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors in `stacked_shapes`' order: a layer's expert linears held until its last,
    then yielded as the two stacks (each expert's gate rows, then its up rows)."""
    held: dict[str, list[torch.Tensor]] = {"gate": [], "up": [], "down": []}
    for name, value in values:
        if (match := _EXPERT.fullmatch(name)) is None:
            yield name, value
            continue
        held[match[3]].append(value)
        if (prefix := _last_down(name, shapes)) is not None:
            gate_up = [torch.cat(pair) for pair in zip(held["gate"], held["up"], strict=True)]
            yield f"{prefix}.{GRANITE_STACKS['gate_up']}", torch.stack(gate_up)
            yield f"{prefix}.{GRANITE_STACKS['down']}", torch.stack(held["down"])
            held = {"gate": [], "up": [], "down": []}
