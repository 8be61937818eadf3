"""GGUF -> Hugging Face directory, and a content-addressed cache of such conversions.

The converted directory holds float32 weights (the GGUF dequantized, in Hugging Face layout) plus
config.json, tokenizer.json, tokenizer_config.json and generation_config.json, so both nanoserve and
transformers load it, and loading it gives tensors identical to loading the GGUF itself.

The cache is keyed by the GGUF's sha256 (and the converter's version), and every entry appears
by one atomic rename of a finished temporary directory: a crash leaves no half-written entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Iterable, Mapping
from math import prod
from pathlib import Path
from typing import Any

import torch

from nanoserve.runtime.errors import WeightsError
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.loading.gguf_recurrent import grouped_value_heads
from nanoserve.runtime.loading.hf_config import config_to_hf
from nanoserve.runtime.loading.hf_names import family_name
from nanoserve.runtime.loading.hf_stacked import stacked_shapes, stacked_values

# Bump when convert_gguf's output changes: cached conversions from older versions are then ignored.
CONVERTER_VERSION = 1
_HASH_CHUNK_BYTES = 1 << 20
_STALE_TEMP_SECONDS = 3600  # temporary directories older than this were left by a crash


def convert_gguf(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """Write `gguf_path` as a Hugging Face model directory at `out_dir` (created if missing)."""
    checkpoint = load_checkpoint(gguf_path)
    if checkpoint.format != "gguf":
        raise WeightsError(gguf_path, "is not a .gguf file")
    model = checkpoint.config
    if model.delta_net is not None:  # written with its value heads back in grouped order
        model = dataclasses.replace(
            model, delta_net=dataclasses.replace(model.delta_net, tiled=False)
        )
    fuse = model.architecture == "granitemoehybrid" and not model.fused_mlp
    if fuse:  # written with gate and up as one, as Granite's checkpoints hold them
        model = dataclasses.replace(model, fused_mlp=True)
    config = config_to_hf(model)  # first: a config with no config.json form is refused
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arch = checkpoint.config.architecture
    shapes, values = checkpoint.tensor_shapes(), _hf_values(checkpoint)
    if fuse:
        shapes, values = _fused_mlp_shapes(shapes), _fused_mlp_values(values)
    if arch in ("granitemoehybrid", "gpt_oss", "gemma4") and model.experts is not None:  # stacks
        values = stacked_values(arch, values, shapes)
        shapes = stacked_shapes(arch, shapes)
    shapes = {family_name(arch, name): shape for name, shape in shapes.items()}
    named = ((family_name(arch, name), value) for name, value in values)  # LFM2's own names
    _write_safetensors(out / "model.safetensors", shapes, named)
    _write_json(out / "config.json", config)
    (out / "tokenizer.json").write_text(checkpoint.tokenizer.to_json(), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", _tokenizer_config(checkpoint))
    _write_json(out / "generation_config.json", _generation_config(checkpoint))
    return out


def _hf_values(checkpoint: Checkpoint) -> Iterable[tuple[str, torch.Tensor]]:
    """The tensors as transformers reads them: Gemma 3's and Qwen3.5's GGUF norms hold 1 + w
    (llama.cpp's converter added the 1; DeltaNet's own norm excepted); a config.json of their
    families implies it, so w is written. Qwen3.5's value heads go back to grouped order."""
    config = checkpoint.config
    arch = config.architecture
    shift = arch in ("gemma3", "qwen3_5") and config.norm_offset == 0.0
    for name, tensor in checkpoint.tensors():
        norm = name.endswith("norm.weight") and not name.endswith(".linear_attn.norm.weight")
        value = tensor - 1.0 if shift and norm else tensor
        if config.delta_net is not None:
            value = grouped_value_heads(name, value, config.delta_net)
        yield name, value


def _fused_mlp_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Each layer's gate_proj and up_proj as one gate_up_proj, where the gate was."""
    fused: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if name.endswith(".mlp.gate_proj.weight"):
            fused[name.replace(".gate_proj.", ".gate_up_proj.")] = (2 * shape[0], *shape[1:])
        elif not name.endswith(".mlp.up_proj.weight"):
            fused[name] = shape
    return fused


def _fused_mlp_values(
    values: Iterable[tuple[str, torch.Tensor]],
) -> Iterable[tuple[str, torch.Tensor]]:
    """The tensors with each gate_proj held until its up_proj (the next MLP tensor) and
    yielded as one gate_up_proj, gate rows first."""
    gate: torch.Tensor | None = None
    for name, value in values:
        if name.endswith(".mlp.gate_proj.weight"):
            gate = value
        elif name.endswith(".mlp.up_proj.weight"):
            assert gate is not None  # expected_tensor_shapes lists gate right before up
            yield name.replace(".up_proj.", ".gate_up_proj."), torch.cat((gate, value))
            gate = None
        else:
            yield name, value


def cached_conversion(
    gguf_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """The converted directory for `gguf_path`, converting only if the cache lacks it.

    `cache_dir` defaults to `default_cache_dir()` ($XDG_CACHE_HOME/nanoserve or ~/.cache/nanoserve).
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"gguf-{file_sha256(gguf_path)}-v{CONVERTER_VERSION}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(root, target.name)
    temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        convert_gguf(gguf_path, temp)
        _fsync_files(temp)  # the rename must not publish files whose data is still in flight
        try:
            temp.rename(target)
        except OSError:
            if not target.is_dir():  # not a concurrent conversion winning the race: a real error
                raise
            shutil.rmtree(temp)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return target


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_CACHE_HOME/nanoserve, or ~/.cache/nanoserve (XDG ignores relative values)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "nanoserve"


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (never whole into memory)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as file:
            while chunk := file.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
    except OSError as error:
        raise WeightsError(path, f"cannot be read ({error.strerror})") from None
    return digest.hexdigest()


def _write_safetensors(
    path: Path,
    shapes: Mapping[str, tuple[int, ...]],
    tensors: Iterable[tuple[str, torch.Tensor]],
) -> None:
    """Write float32 tensors as safetensors one at a time, so only one is ever in memory.

    The header (names, shapes, byte offsets) is known from `shapes` before any data is read;
    the data then follows in the same order. Layout: u64 header length, JSON header padded with
    spaces to 8 bytes, raw little-endian tensor bytes.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = prod(shape) * 4
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(blob)))
        file.write(blob)
        for (name, tensor), expected in zip(tensors, shapes, strict=True):
            if name != expected or tensor.dtype != torch.float32:  # cannot happen for a GGUF
                raise WeightsError(
                    path, f"expected float32 {expected!r}, got {tensor.dtype} {name!r}"
                )
            file.write(tensor.contiguous().numpy().tobytes())


def _tokenizer_config(checkpoint: Checkpoint) -> dict[str, Any]:
    tokenizer = checkpoint.tokenizer
    bos = tokenizer.bos_token_id
    eos = tokenizer.eos_token_ids
    return {
        # BOS handling (if any) lives in tokenizer.json's post-processor, not in a flag here.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.id_to_token(bos) if bos is not None else None,
        "eos_token": tokenizer.id_to_token(eos[0]) if eos else None,
        "chat_template": checkpoint.chat_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": checkpoint.config.max_position_embeddings,
    }


def _generation_config(checkpoint: Checkpoint) -> dict[str, Any]:
    eos = list(checkpoint.config.eos_token_ids)
    return {
        "bos_token_id": checkpoint.config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
    }


def _write_json(path: Path, value: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _fsync_files(directory: Path) -> None:
    for path in directory.iterdir():
        with path.open("rb") as file:
            os.fsync(file.fileno())


def _remove_stale_temps(root: Path, name: str) -> None:
    now = time.time()
    for temp in root.glob(f".{name}.*"):
        try:
            if now - temp.stat().st_mtime > _STALE_TEMP_SECONDS:
                shutil.rmtree(temp, ignore_errors=True)
        except FileNotFoundError:  # another process cleaned it first
            continue
