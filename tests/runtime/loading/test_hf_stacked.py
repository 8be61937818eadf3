"""hf_stacked.py: experts stored stacked are read as one tensor per expert, each the slice of
its stack, and written back as the stacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.loading.hf_stacked import stacked_parts, stacked_shapes, stacked_values


def test_granites_stacks_are_each_experts_gate_up_and_down_rows() -> None:
    parts = stacked_parts(
        "granitemoehybrid", "model.layers.3.block_sparse_moe.input_linear.weight", (2, 8, 5)
    )
    assert parts is not None
    gate, shape = parts["model.layers.3.mlp.experts.1.gate_proj.weight"]
    assert (gate.expert, gate.start, gate.stop, shape) == (1, 0, 4, (4, 5))
    up, _ = parts["model.layers.3.mlp.experts.1.up_proj.weight"]
    assert (up.start, up.stop) == (4, 8)
    assert len(parts) == 4
    down = stacked_parts(
        "granitemoehybrid", "model.layers.3.block_sparse_moe.output_linear.weight", (2, 5, 4)
    )
    assert down is not None and down["model.layers.3.mlp.experts.0.down_proj.weight"][1] == (5, 4)
    # a stack's name from another family, or a 2-D tensor, is not a stack
    assert (
        stacked_parts("llama", "model.layers.3.block_sparse_moe.input_linear.weight", (2, 8, 5))
        is None
    )
    assert stacked_parts("qwen3_moe", "model.layers.0.mlp.experts.gate_up_proj", (8, 5)) is None


def test_transformers_own_stacked_form_loads_the_same_tensors(
    tmp_path: Path, make_tiny_model_dir: Callable[..., Path]
) -> None:
    """A Qwen3-MoE saved as transformers 5's modules hold it (`mlp.experts.gate_up_proj`
    [experts, 2 * width, hidden], `mlp.experts.down_proj`) reads as the per-expert file does."""
    model_dir = make_tiny_model_dir(tmp_path, arch="qwen3_moe")
    expected = dict(load_checkpoint(model_dir).tensors())
    tensors = load_file(model_dir / "model.safetensors")
    stacked: dict[str, torch.Tensor] = {}
    for layer in range(load_checkpoint(model_dir).config.num_layers):
        p = f"model.layers.{layer}.mlp.experts"
        gate_up = [torch.cat((tensors.pop(f"{p}.{e}.gate_proj.weight"),
                              tensors.pop(f"{p}.{e}.up_proj.weight"))) for e in range(4)]  # fmt: skip
        stacked[f"{p}.gate_up_proj"] = torch.stack(gate_up)
        stacked[f"{p}.down_proj"] = torch.stack(
            [tensors.pop(f"{p}.{e}.down_proj.weight") for e in range(4)]
        )
    save_file({**tensors, **stacked}, model_dir / "model.safetensors")
    loaded = dict(load_checkpoint(model_dir).tensors())
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[name], expected[name]) for name in expected)


def test_written_back_as_the_stacks_in_the_order_of_their_shapes() -> None:
    shapes: dict[str, tuple[int, ...]] = {"model.layers.0.mlp.gate.weight": (2, 5)}
    values: list[tuple[str, torch.Tensor]] = [("model.layers.0.mlp.gate.weight", torch.zeros(2, 5))]
    for e in range(2):
        for part, shape in (("gate", (4, 5)), ("up", (4, 5)), ("down", (5, 4))):
            name = f"model.layers.0.mlp.experts.{e}.{part}_proj.weight"
            shapes[name] = shape
            values.append((name, torch.full(shape, float(10 * e + len(part)))))
    shapes["model.layers.0.mlp.down_proj.weight"] = (5, 3)
    values.append(("model.layers.0.mlp.down_proj.weight", torch.ones(5, 3)))
    out_shapes = stacked_shapes("granitemoehybrid", shapes)
    written = list(stacked_values("granitemoehybrid", values, shapes))
    assert [name for name, _ in written] == list(out_shapes)
    assert [tuple(v.shape) for _, v in written] == list(out_shapes.values())
    gate_up = dict(written)["model.layers.0.block_sparse_moe.input_linear.weight"]
    assert gate_up.shape == (2, 8, 5)
    assert gate_up[1, :4].unique().tolist() == [14.0] and gate_up[1, 4:].unique().tolist() == [12.0]
    # each slice read back is the tensor written
    parts = stacked_parts("granitemoehybrid", "model.layers.0.block_sparse_moe.input_linear.weight",
                          tuple(gate_up.shape))  # fmt: skip
    assert parts is not None
    up, _ = parts["model.layers.0.mlp.experts.1.up_proj.weight"]
    assert torch.equal(gate_up[up.expert, up.start : up.stop], dict(values)[
        "model.layers.0.mlp.experts.1.up_proj.weight"])  # fmt: skip
