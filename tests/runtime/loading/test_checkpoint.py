from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from nanoserve.runtime.errors import ConfigError, TokenizerError, WeightsError
from nanoserve.runtime.loading.checkpoint import expected_tensor_shapes, load_checkpoint


def _copy(model_dir: Path, tmp_path: Path) -> Path:
    """A writable copy of a session-scoped tiny model."""
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_llama_untied_dir", "tiny_qwen2_dir"])
def test_tensors_equal_transformers_state_dict(
    fixture: str,
    request: pytest.FixtureRequest,
    hf_state_dict: Callable[[Path], dict[str, torch.Tensor]],
) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    checkpoint = load_checkpoint(model_dir)
    ours = dict(checkpoint.tensors())
    reference = hf_state_dict(model_dir)
    assert list(ours) == list(checkpoint.tensor_shapes())
    assert set(ours) == set(reference)
    for name, tensor in ours.items():
        assert tensor.dtype == reference[name].dtype == torch.float32, name
        assert torch.equal(tensor, reference[name]), name


def test_load_order_and_shapes_for_a_tiny_qwen2(tiny_qwen2_dir: Path) -> None:
    shapes = load_checkpoint(tiny_qwen2_dir).tensor_shapes()
    assert len(shapes) == 1 + 2 * 12 + 1 + 1  # embed, 2 layers of 12, norm, untied lm_head
    assert list(shapes.items())[:8] == [
        ("model.embed_tokens.weight", (320, 64)),
        ("model.layers.0.self_attn.q_proj.weight", (64, 64)),
        ("model.layers.0.self_attn.k_proj.weight", (32, 64)),
        ("model.layers.0.self_attn.v_proj.weight", (32, 64)),
        ("model.layers.0.self_attn.q_proj.bias", (64,)),
        ("model.layers.0.self_attn.k_proj.bias", (32,)),
        ("model.layers.0.self_attn.v_proj.bias", (32,)),
        ("model.layers.0.self_attn.o_proj.weight", (64, 64)),
    ]
    assert list(shapes.items())[-3:] == [
        ("model.layers.1.post_attention_layernorm.weight", (64,)),
        ("model.norm.weight", (64,)),
        ("lm_head.weight", (320, 64)),
    ]


def test_checkpoint_carries_config_tokenizer_and_template(tiny_llama_dir: Path) -> None:
    checkpoint = load_checkpoint(str(tiny_llama_dir))  # str paths are accepted too
    assert checkpoint.format == "hf"
    assert checkpoint.path == tiny_llama_dir
    assert checkpoint.config.eos_token_ids == checkpoint.tokenizer.eos_token_ids == (2,)
    assert checkpoint.tokenizer.encode("<|im_start|>hi") == [1, *checkpoint.tokenizer.encode("hi")]
    assert checkpoint.chat_template is not None and "<|im_start|>" in checkpoint.chat_template


def test_sharded_checkpoint_loads_identically(tiny_llama_untied_dir: Path, tmp_path: Path) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_untied_dir)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="40KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama_untied_dir / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    ours = dict(load_checkpoint(sharded).tensors())
    reference = dict(load_checkpoint(tiny_llama_untied_dir).tensors())
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in ours)


def test_bf16_weights_keep_their_dtype(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    weights = load_file(model_dir / "model.safetensors")
    save_file(
        {k: v.to(torch.bfloat16) for k, v in weights.items()}, model_dir / "model.safetensors"
    )
    ours = dict(load_checkpoint(model_dir).tensors())
    assert {t.dtype for t in ours.values()} == {torch.bfloat16}
    assert torch.equal(ours["model.norm.weight"], weights["model.norm.weight"].to(torch.bfloat16))


def test_chat_template_jinja_file_wins(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    (model_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert load_checkpoint(model_dir).chat_template == "{{ messages[0]['content'] }}"


def test_eos_falls_back_to_tokenizer_config(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    config["eos_token_id"] = None
    (model_dir / "config.json").write_text(json.dumps(config))
    (model_dir / "generation_config.json").unlink()
    checkpoint = load_checkpoint(model_dir)  # tokenizer_config says eos_token "<|im_end|>"
    assert checkpoint.config.eos_token_ids == checkpoint.tokenizer.eos_token_ids == (2,)


# -- errors: each names the file and the problem, before any tensor is read ---------------------


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(
        WeightsError, match=f"^{re.escape(str(tmp_path / 'nope'))}: no such file or directory$"
    ):
        load_checkpoint(tmp_path / "nope")


def test_neither_directory_nor_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(WeightsError, match=re.escape("neither a model directory nor a .gguf file")):
        load_checkpoint(path)


def test_missing_config_json(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    (model_dir / "config.json").unlink()
    with pytest.raises(
        ConfigError, match=f"^{re.escape(str(model_dir / 'config.json'))}: file not found$"
    ):
        load_checkpoint(model_dir)


def test_missing_tokenizer_json(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(TokenizerError, match=re.escape("tokenizer.json: file not found")):
        load_checkpoint(model_dir)


def test_missing_safetensors(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match=re.escape("holds no *.safetensors file")):
        load_checkpoint(model_dir)


def test_truncated_safetensors(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(WeightsError) as caught:
        load_checkpoint(model_dir)
    assert str(caught.value).startswith(f"{weights}: is not a readable safetensors file")


def test_shard_listed_in_index_but_missing(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    index = {"weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors"}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        WeightsError, match=re.escape("model-00002-of-00002.safetensors: is missing")
    ):
        load_checkpoint(model_dir)


def test_config_disagreeing_with_tensor_shapes(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    config["intermediate_size"] = 96
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError) as caught:
        load_checkpoint(model_dir)
    assert str(caught.value) == (
        f"{model_dir}: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128, 64], "
        "but the config implies [96, 64]"
    )


def test_missing_tensor_is_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    weights = load_file(model_dir / "model.safetensors")
    del weights["model.layers.1.post_attention_layernorm.weight"]
    save_file(weights, model_dir / "model.safetensors")
    with pytest.raises(
        WeightsError, match=re.escape("'model.layers.1.post_attention_layernorm.weight' is missing")
    ):
        load_checkpoint(model_dir)


def test_untied_config_over_tied_weights(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=re.escape("tensor 'lm_head.weight' is missing")):
        load_checkpoint(model_dir)


def test_unexpected_tensor_is_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(tiny_llama_dir, tmp_path)
    weights = load_file(model_dir / "model.safetensors")
    weights["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(weights, model_dir / "model.safetensors")
    with pytest.raises(
        WeightsError, match=re.escape("does not imply: model.layers.0.self_attn.q_proj.bias")
    ):
        load_checkpoint(model_dir)


def test_expected_shapes_follow_config_geometry(
    tmp_path: Path, make_tiny_model_dir: Callable[..., Path]
) -> None:
    model_dir = make_tiny_model_dir(tmp_path, num_key_value_heads=4, head_dim=8)
    config = load_checkpoint(model_dir).config
    shapes = expected_tensor_shapes(config)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (32, 64)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (32, 64)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (64, 32)
    assert "lm_head.weight" not in shapes
