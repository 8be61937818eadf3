"""A Hugging Face model directory: config.json, safetensors shards, tokenizer files.

Opening reads only JSON and the safetensors headers (names, shapes); tensors are read one at a time
from the memory-mapped shards when `iter_tensors` is walked, so loading never holds a second full
copy of the weights.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from nanoserve.runtime.errors import (
    ChatTemplateError,
    CheckpointError,
    ConfigError,
    TokenizerError,
    WeightsError,
)
from nanoserve.runtime.loading.encoder_names import with_fused_qkv
from nanoserve.runtime.loading.hf_names import canonical_name, skipped_part
from nanoserve.runtime.loading.hf_stacked import StackedPart, stacked_parts
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.text.tokenizer import Tokenizer

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True, slots=True)
class HfDir:
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    shard_of: Mapping[str, Path] = field(repr=False)  # tensor name -> the file holding it
    shapes: Mapping[str, tuple[int, ...]] = field(repr=False)  # from the file headers
    # The loader's name -> the file's, where the family names it otherwise (hf_names.py).
    stored_names: Mapping[str, str] = field(repr=False, default_factory=dict)
    # An expert's linear stored within a stack of them all (hf_stacked.py): name -> its slice.
    stacked: Mapping[str, StackedPart] = field(repr=False, default_factory=dict)
    # Parts of the checkpoint not loaded (Qwen3.5's vision tower): part -> its tensor count.
    skipped: Mapping[str, int] = field(default_factory=dict)
    config_json: Mapping[str, Any] = field(repr=False, default_factory=dict)  # as stored

    @classmethod
    def open(cls, path: Path) -> HfDir:
        config_json = _read_json(path / "config.json", ConfigError, required=True)
        generation = _read_json(path / "generation_config.json", ConfigError, required=False)
        config = ModelConfig.from_hf(config_json, generation, source=str(path / "config.json"))
        tokenizer_config = _read_json(
            path / "tokenizer_config.json", TokenizerError, required=False
        )
        tokenizer = Tokenizer.from_file(
            path / "tokenizer.json",
            eos_token_ids=config.eos_token_ids,
            bos_token_id=config.bos_token_id,
        )
        eos = None if config.eos_token_ids else _tokenizer_config_eos(tokenizer_config, tokenizer)
        if eos is not None:
            config = dataclasses.replace(config, eos_token_ids=(eos,))
            tokenizer = Tokenizer(
                tokenizer.backend, eos_token_ids=(eos,), bos_token_id=config.bos_token_id
            )
        shard_of, shapes = _read_headers(path)
        arch = config.architecture
        skipped: dict[str, int] = {}
        for name in shapes:
            if (part := skipped_part(arch, name)) is not None:
                skipped[part] = skipped.get(part, 0) + 1
        stored = {
            canonical_name(arch, name): name for name in shapes if skipped_part(arch, name) is None
        }
        split: dict[str, tuple[StackedPart, tuple[int, ...]]] = {}  # experts stored stacked
        for known, name in list(stored.items()):
            if (parts := stacked_parts(arch, name, shapes[name], known)) is not None:
                del stored[known]
                split.update(parts)
        if config.encoder is not None:  # q, k and v as one tensor or three: as the file has them
            config = with_fused_qkv(config, stored)
        return cls(
            path=path,
            config=config,
            tokenizer=tokenizer,
            chat_template=_chat_template(path, tokenizer_config),
            shard_of={known: shard_of[name] for known, name in stored.items()}
            | {known: shard_of[part.stored] for known, (part, _) in split.items()},
            shapes={known: shapes[name] for known, name in stored.items()}
            | {known: shape for known, (_, shape) in split.items()},
            stacked={known: part for known, (part, _) in split.items()},
            stored_names={known: name for known, name in stored.items() if known != name},
            skipped=skipped,
            config_json=config_json,
        )

    def tensor_shapes(self) -> Mapping[str, tuple[int, ...]]:
        return self.shapes

    def iter_tensors(
        self, names: Sequence[str], keep_blocks: frozenset[str] = frozenset()
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """`(name, tensor)` in the order asked, in the dtype stored, each read from the mmap.
        (`keep_blocks` names GGUF block types; safetensors hold none.)"""
        with ExitStack() as stack:
            handles: dict[Path, Any] = {}
            for name in names:
                shard = self.shard_of[name]
                if shard not in handles:
                    handles[shard] = stack.enter_context(_open(shard))
                try:
                    if (part := self.stacked.get(name)) is not None:
                        tensor = part.read(handles[shard])
                    else:
                        tensor = handles[shard].get_tensor(self.stored_names.get(name, name))
                except SafetensorError as error:
                    raise WeightsError(shard, f"cannot read tensor {name!r}: {error}") from None
                yield name, tensor


def _read_headers(path: Path) -> tuple[dict[str, Path], dict[str, tuple[int, ...]]]:
    index_path = path / INDEX_FILE
    if index_path.is_file():
        index = _read_json(index_path, WeightsError, required=True)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightsError(index_path, "has no 'weight_map' object")
        files = sorted({path / name for name in weight_map.values()})
    elif (path / SINGLE_FILE).is_file():
        weight_map, files = None, [path / SINGLE_FILE]
    else:
        files = sorted(path.glob("*.safetensors"))
        weight_map = None
        if not files:
            raise WeightsError(
                path, "holds no *.safetensors file (other weight formats are not read)"
            )

    shard_of: dict[str, Path] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        if not file.is_file():
            raise WeightsError(file, f"is missing (listed in {INDEX_FILE})")
        with _open(file) as handle:
            for name in handle.keys():  # noqa: SIM118 - a safe_open handle is not a mapping
                if name in shard_of:
                    raise WeightsError(file, f"tensor {name!r} is also in {shard_of[name].name}")
                shard_of[name] = file
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    if weight_map is not None:
        for name, file_name in weight_map.items():
            if shard_of.get(name) != path / file_name:
                raise WeightsError(
                    path / file_name, f"does not hold tensor {name!r}, as the index says"
                )
    return shard_of, shapes


def _open(file: Path) -> Any:
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError) as error:
        # A truncated file fails here: its header promises more bytes than the file holds.
        raise WeightsError(file, f"is not a readable safetensors file ({error})") from None


def _read_json(file: Path, error: type[CheckpointError], *, required: bool) -> dict[str, Any]:
    if not file.is_file():
        if required:
            raise error(file, "file not found")
        return {}
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as problem:
        raise error(file, f"is not valid JSON ({problem})") from None
    if not isinstance(value, dict):
        raise error(file, f"holds a JSON {type(value).__name__}, not an object")
    return value


def _chat_template(path: Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    # transformers >= 4.43 saves the template beside the config as chat_template.jinja.
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # several named templates; "default" is the chat one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(path / "tokenizer_config.json", "chat_template is not a string")
    return template


def _tokenizer_config_eos(tokenizer_config: Mapping[str, Any], tokenizer: Tokenizer) -> int | None:
    """The id of tokenizer_config's `eos_token`: the fallback when no config names an eos id."""
    eos = tokenizer_config.get("eos_token")
    if isinstance(eos, dict):  # an AddedToken written out: {"content": "</s>", ...}
        eos = eos.get("content")
    return tokenizer.token_to_id(eos) if isinstance(eos, str) else None
