"""ExpertArena: a GGUF's experts packed once into a cache file, then mapped on every boot."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.quant_weight import QuantLinear
from tests.runtime.paged_logits import paged_logits

PROMPT = [5, 17, 3, 99, 250, 31, 7, 7, 120, 64, 8]


@pytest.fixture(scope="module")
def moe_gguf(
    tmp_path_factory: pytest.TempPathFactory,
    make_tiny_model_dir: Callable[..., Path],
    write_tiny_gguf: Callable[..., Path],
) -> Path:
    from gguf import GGMLQuantizationType

    tmp = tmp_path_factory.mktemp("arena")
    model_dir = make_tiny_model_dir(tmp, arch="qwen3_moe")
    return write_tiny_gguf(model_dir, tmp / "moe.gguf", qtype=GGMLQuantizationType.Q8_0)


def served(path: Path) -> LlamaModel:
    return LlamaModel.from_checkpoint(load_checkpoint(path), max_positions=64, quantize="gguf")


def expert_bytes(model: LlamaModel) -> list[torch.Tensor]:
    return [
        part.packed
        for layer in model.layers
        if layer.experts is not None
        for linear in (*layer.experts.gate_up, *layer.experts.down)
        if isinstance(linear, QuantLinear)
        for part in linear.parts
    ]


def test_experts_are_packed_once_then_mapped(
    moe_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first boot packs the experts into one file (the bytes the in-memory packing makes,
    each expert a view of it, nothing else in it); a later boot maps it and packs nothing; both serve the logits of
    the experts packed into memory, bit for bit."""
    in_memory = served(moe_gguf)
    assert in_memory.expert_usage is not None and in_memory.expert_usage.arena is None
    monkeypatch.setenv("NANOSERVE_EXPERT_CACHE", str(tmp_path))
    first = served(moe_gguf)
    usage = first.expert_usage
    assert usage is not None and usage.arena is not None and not usage.arena.reused
    [file] = tmp_path.iterdir()  # complete, named, and no partial file left
    assert file == usage.arena.path and file.suffix == ".bin"
    packed = expert_bytes(in_memory)
    assert file.stat().st_size == sum(p.numel() for p in packed) == usage.total_bytes
    assert torch.equal(torch.cat(expert_bytes(first)), torch.cat(packed))
    mapped = usage.arena.mapped.untyped_storage().data_ptr()  # every expert a view of the file
    assert all(p.untyped_storage().data_ptr() == mapped for p in expert_bytes(first))
    expected = paged_logits(in_memory, PROMPT)
    assert torch.equal(paged_logits(first, PROMPT), expected)

    packs = 0
    pack_weight = kernel_ops.pack_weight

    def counted(*args: object) -> torch.Tensor:
        nonlocal packs
        packs += 1
        return pack_weight(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(kernel_ops, "pack_weight", counted)
    monkeypatch.setenv("NANOSERVE_EXPERT_CACHE", "off")
    served(moe_gguf)
    in_memory_packs, packs = packs, 0
    monkeypatch.setenv("NANOSERVE_EXPERT_CACHE", str(tmp_path))
    again = served(moe_gguf)
    assert packs == in_memory_packs - len(packed)  # every weight but the experts
    assert again.expert_usage is not None and again.expert_usage.arena is not None
    assert again.expert_usage.arena.reused and again.expert_usage.arena.path == file
    assert torch.equal(paged_logits(again, PROMPT), expected)
    health = again.expert_usage.as_dict()
    assert health["mapped_from"] == str(file) and health["reused"] is True


def test_a_changed_file_packs_anew(
    moe_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key holds the GGUF's size and time: a file replaced in place is not served from the
    old packing."""
    monkeypatch.setenv("NANOSERVE_EXPERT_CACHE", str(tmp_path))
    copy = tmp_path.parent / "copy.gguf"
    copy.write_bytes(moe_gguf.read_bytes())
    served(copy)
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    usage = served(copy).expert_usage
    assert usage is not None and usage.arena is not None and not usage.arena.reused
    assert len(list(tmp_path.glob("*.bin"))) == 2


def test_a_boot_killed_while_packing_leaves_no_file_behind(
    moe_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partial file is never read (only a complete one is named), and the next boot of the
    same key removes it where its writer is gone."""
    monkeypatch.setenv("NANOSERVE_EXPERT_CACHE", str(tmp_path))
    usage = served(moe_gguf).expert_usage
    assert usage is not None and usage.arena is not None
    file = usage.arena.path
    file.rename(file.with_name(f"{file.name}.4194305.partial"))  # above any pid_max: gone
    usage = served(moe_gguf).expert_usage
    assert usage is not None and usage.arena is not None and not usage.arena.reused
    assert [p.name for p in tmp_path.iterdir()] == [file.name]


@pytest.mark.parametrize("setting", ["off", "unwritable"])
def test_without_a_cache_the_experts_are_packed_into_memory(
    moe_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NANOSERVE_EXPERT_CACHE", "off" if setting == "off" else str(blocker / "x"))
    usage = served(moe_gguf).expert_usage
    assert usage is not None and usage.arena is None
    assert usage.as_dict()["mapped_from"] is None
