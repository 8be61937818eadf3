from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from nanoserve.runtime.errors import UnsupportedQuantError, WeightsError
from nanoserve.runtime.loading.checkpoint import Checkpoint, load_checkpoint
from nanoserve.runtime.loading.convert import (
    CONVERTER_VERSION,
    cached_conversion,
    convert_gguf,
    default_cache_dir,
    file_sha256,
)
from nanoserve.runtime.text.chat_template import ChatTemplate

TEXTS = [
    "Hello, world! 12345",
    "x  1 and \n\n\n2",
    "<|im_start|>user\nhéllo 你好 🤗<|im_end|>\n",
    "def f(x):\n    return x",
]
MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]


@pytest.fixture(scope="module")
def tiny_gguf(
    tiny_llama_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    write_tiny_gguf: Callable[..., Path],
) -> Path:
    return write_tiny_gguf(
        tiny_llama_dir, tmp_path_factory.mktemp("gguf") / "tiny.gguf", qtype=Q.Q8_0
    )


def _assert_same_checkpoint(converted: Checkpoint, original: Checkpoint) -> None:
    assert converted.format == "hf"
    assert converted.config == original.config
    assert converted.chat_template == original.chat_template
    ours, theirs = dict(converted.tensors()), dict(original.tensors())
    assert list(ours) == list(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    for text in TEXTS:
        assert converted.tokenizer.encode(text) == original.tokenizer.encode(text), text
    assert converted.tokenizer.eos_token_ids == original.tokenizer.eos_token_ids
    assert converted.tokenizer.bos_token_id == original.tokenizer.bos_token_id


def test_convert_round_trip(tiny_gguf: Path, tmp_path: Path) -> None:
    out = convert_gguf(tiny_gguf, tmp_path / "converted")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    _assert_same_checkpoint(load_checkpoint(out), load_checkpoint(tiny_gguf))
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2}
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert (tokenizer_config["bos_token"], tokenizer_config["eos_token"]) == (
        "<|im_start|>",
        "<|im_end|>",
    )


def test_transformers_loads_the_converted_directory(
    tiny_gguf: Path, tmp_path: Path, hf_state_dict: Callable[[Path], dict[str, torch.Tensor]]
) -> None:
    from transformers import AutoTokenizer

    out = convert_gguf(tiny_gguf, tmp_path / "converted")
    ours = dict(load_checkpoint(tiny_gguf).tensors())
    reference = hf_state_dict(out)
    assert reference.keys() == ours.keys()
    assert all(torch.equal(reference[k], ours[k]) for k in ours)
    hf_tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer = load_checkpoint(out).tokenizer
    for text in TEXTS:
        assert hf_tokenizer(text)["input_ids"] == tokenizer.encode(text), text
    assert hf_tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    ) == (ChatTemplate.from_checkpoint(load_checkpoint(out)).render(MESSAGES))


def test_convert_refuses_a_directory(tiny_llama_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=re.escape("is not a .gguf file")):
        convert_gguf(tiny_llama_dir, tmp_path / "out")


def test_cached_conversion_converts_once(tiny_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    digest = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert file_sha256(tiny_gguf) == digest
    first = cached_conversion(tiny_gguf, cache)
    assert first == cache / f"gguf-{digest}-v{CONVERTER_VERSION}"
    assert [p.name for p in cache.iterdir()] == [first.name]  # no temporary directory left behind
    weights = first / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert cached_conversion(tiny_gguf, cache) == first
    assert weights.stat().st_mtime_ns == stamp  # served from the cache, not rewritten
    _assert_same_checkpoint(load_checkpoint(first), load_checkpoint(tiny_gguf))


def test_different_files_get_different_entries(
    tiny_gguf: Path, tiny_qwen2_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    other = write_tiny_gguf(tiny_qwen2_dir, tmp_path / "other.gguf")
    cache = tmp_path / "cache"
    assert cached_conversion(tiny_gguf, cache) != cached_conversion(other, cache)
    assert len(list(cache.iterdir())) == 2


def test_failed_conversion_leaves_no_entry(
    tiny_llama_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    q8_1 = np.zeros((128, 2 * 40), dtype=np.uint8)  # a type nanoserve cannot read
    bad = write_tiny_gguf(
        tiny_llama_dir, tmp_path / "bad.gguf", raw_tensors={"blk.1.ffn_up.weight": (q8_1, Q.Q8_1)}
    )
    cache = tmp_path / "cache"
    with pytest.raises(UnsupportedQuantError):
        cached_conversion(bad, cache)
    assert list(cache.iterdir()) == []


def test_missing_gguf_is_named(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=re.escape("nope.gguf: cannot be read")):
        cached_conversion(tmp_path / "nope.gguf", tmp_path / "cache")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"XDG_CACHE_HOME": "/srv/cache"}, Path("/srv/cache/nanoserve")),
        ({}, Path.home() / ".cache" / "nanoserve"),
        ({"XDG_CACHE_HOME": ""}, Path.home() / ".cache" / "nanoserve"),
        ({"XDG_CACHE_HOME": "relative/dir"}, Path.home() / ".cache" / "nanoserve"),  # XDG: ignored
    ],
)
def test_default_cache_dir(environ: dict[str, str], expected: Path) -> None:
    assert default_cache_dir(environ) == expected


@pytest.mark.slow
def test_embedded_convert_round_trip(
    embedded_gguf: Path,
    embedded_checkpoint: Checkpoint,
    embedded_tensors: dict[str, torch.Tensor],
    hf_reference_model: Any,
    tmp_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    out = cached_conversion(embedded_gguf, tmp_path / "cache")
    converted = load_checkpoint(out)
    assert converted.config == embedded_checkpoint.config
    assert converted.chat_template == embedded_checkpoint.chat_template
    count = 0
    for name, tensor in converted.tensors():
        assert torch.equal(tensor, embedded_tensors[name]), name
        count += 1
    assert count == len(embedded_tensors) == 272
    for text in TEXTS:
        assert converted.tokenizer.encode(text) == embedded_checkpoint.tokenizer.encode(text)
    # transformers reads the directory back to the same weights it reads from the GGUF
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    reference = hf_reference_model.state_dict()
    assert reloaded.keys() == reference.keys()
    assert all(torch.equal(reloaded[k], reference[k]) for k in reference)
