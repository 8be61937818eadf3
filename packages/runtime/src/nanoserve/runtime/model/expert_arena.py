"""ExpertArena: a mixture's experts packed once into a file, then mapped rather than resident.

Most of a mixture's bytes are experts a token may never choose (gpt-oss-20b: 10.7 GB of its
12.1). Packed into anonymous memory (as every other linear is) they would all be resident from
boot and count against the memory measured free, as if every step read them. Instead their
packed planes (the kernels' layout, kernels/csrc/weight_types.h) go into one file in the cache
folder ($NANOSERVE_EXPERT_CACHE, else ~/.cache/nanoserve/experts), mapped shared: an expert's
pages come in when a token first chooses it, the OS may drop them again under pressure (they are
clean: the file holds them), and MemAvailable, which the warm-up's budget reads, counts them as
cache, as it counts llama.cpp's mapped GGUF.

The first boot packs each expert straight into the file (space reserved first, so a full disk
is an error at boot rather than a fault mid-write) and names it only once it is complete and
synced; later boots map it and read nothing of the GGUF's experts. A file is keyed by the
GGUF's path, size and modification time, the kernels' source (a packing change packs anew) and
the experts' names, types and shapes. `NANOSERVE_EXPERT_CACHE=off`, a folder that cannot be
written or a disk without the room: the experts are packed into memory, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from nanoserve.runtime.kernels.cpu_kernels import cache_dir as kernel_cache_dir
from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels
from nanoserve.runtime.loading.convert import default_cache_dir
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.quant_weight import QuantWeight, check_groupable
from nanoserve.runtime.model.weight_forms import KERNEL_FORMS, Source, served_type

FEATURE_BLOCK = 16  # output features per packed block (kernels/csrc/weight_types.h)
EXPERT_WEIGHT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight")


def expert_arena(
    config: ModelConfig, weights: Mapping[str, Source], quantize: str | None, path: Path | None
) -> ExpertArena | None:
    """The arena for a GGUF's experts served in their own blocks on the kernels, or None
    (no experts, another form, a directory, or no cache)."""
    if config.experts is None or quantize not in KERNEL_FORMS or path is None or not path.is_file():
        return None
    experts = [
        (name, source)
        for name, source in weights.items()
        if EXPERT_WEIGHT.fullmatch(name)
        and isinstance(source, GgufBlocks)
        and served_type(quantize, source.kind) == source.kind  # no re-quantizing
    ]
    return ExpertArena.open(path, experts)


def packed_bytes(blocks: GgufBlocks) -> int:
    """The bytes `kernel_ops.pack_weight` makes of these blocks."""
    out, width = blocks.shape
    info = torch.ops.nanoserve.weight_type_info(blocks.ggml.number)
    inputs, per_block = int(info[1]), int(info[3])
    return -(-out // FEATURE_BLOCK) * (width // inputs) * per_block


def expert_cache_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where expert files live, or None where the cache is off."""
    env = os.environ if environ is None else environ
    chosen = env.get("NANOSERVE_EXPERT_CACHE", "")
    if chosen == "off":
        return None
    try:
        return Path(chosen) if chosen else default_cache_dir(env) / "experts"
    except RuntimeError:  # no home directory to default to
        return None


def drop_abandoned(path: Path) -> None:
    """Partial files of this key whose writer is gone (a boot killed while packing)."""
    for partial in path.parent.glob(f"{path.name}.*.partial"):
        try:
            os.kill(int(partial.name.split(".")[-2]), 0)
        except ProcessLookupError:
            partial.unlink(missing_ok=True)
        except (ValueError, PermissionError):  # not ours to judge
            continue


@dataclass(slots=True)
class ExpertArena:
    """One file of packed experts, mapped: `place` hands out each expert's packed weight."""

    path: Path  # the complete file's name (the partial one is renamed to it by `finish`)
    mapped: torch.Tensor  # [bytes] uint8, the file mapped shared
    offsets: dict[str, tuple[int, int]]  # expert tensor name -> (offset, bytes)
    reused: bool  # the file existed whole: nothing is packed, only mapped
    partial: Path | None = None  # the file being written, until `finish`

    @classmethod
    def open(cls, gguf: Path, experts: Sequence[tuple[str, GgufBlocks]]) -> ExpertArena | None:
        """The arena for these experts of this file, or None where there is no cache."""
        root = expert_cache_dir()
        if root is None or not experts:
            return None
        load_cpu_kernels()
        offsets, at = {}, 0
        for name, blocks in experts:
            check_groupable(blocks.shape, blocks.kind)
            size = packed_bytes(blocks)
            offsets[name] = (at, size)
            at += size
        stat = gguf.stat()
        key = {
            "gguf": str(gguf.resolve()),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "kernels": kernel_cache_dir().name,
            "experts": [(n, b.kind, b.shape) for n, b in experts],
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        path = root / f"{gguf.stem}-{digest}.bin"
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        try:
            if path.is_file() and path.stat().st_size == at:
                return cls(
                    path, torch.from_file(str(path), True, at, dtype=torch.uint8), offsets, True
                )
            root.mkdir(parents=True, exist_ok=True)
            drop_abandoned(path)
            with open(partial, "wb") as file:
                os.posix_fallocate(file.fileno(), 0, at)  # the room, now: no fault mid-write
            mapped = torch.from_file(str(partial), True, at, dtype=torch.uint8)
        except (OSError, RuntimeError):  # RuntimeError: torch's, for a file it cannot map
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            return None
        return cls(path, mapped, offsets, False, partial)

    def holds(self, name: str) -> bool:
        return name in self.offsets

    def place(self, name: str, blocks: GgufBlocks) -> QuantWeight:
        """The expert's packed weight, a view of the file: packed into it on the first boot,
        read from it on later ones (the blocks' pages are never touched then)."""
        at, size = self.offsets[name]
        view = self.mapped[at : at + size]
        if not self.reused:
            view.copy_(QuantWeight.pack(blocks).packed)
        blocks.done()
        out, width = blocks.shape
        return QuantWeight(view, blocks.kind, out, width, blocks.kind)

    def finish(self) -> None:
        """Every expert is placed: the file is synced and named (a crash before leaves only a
        partial file, which no boot reads)."""
        if self.partial is None:
            return
        with open(self.partial, "rb+") as file:
            os.fsync(file.fileno())  # the mapping's writes are the page cache's: onto the disk
        os.replace(self.partial, self.path)
        self.partial = None
