"""Qwen3-MoE, OLMoE, Qwen3.5-MoE (the hybrid with a gated shared expert), LFM2-MoE and
Granite 4.0-H's experts (stacked, beside the dense MLP): greedy tokens against transformers
(recomputing everything), on a prefix cache hit, with a dense layer among the routed ones, and their configs from both loaders.
Alone, batched, eager, bucketed, recorded, the kernels and the CUDA trace are in
test_architectures.py; routing and dispatch in test_experts.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.runtime.errors import UnsupportedModelError
from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.model.llama import LlamaModel
from tests.runtime.hybrid_engine import PROMPT, engine_of, greedy, transformers_greedy
from tests.runtime.paged_logits import paged_logits, rel_error

FAMILIES = ["qwen3_moe", "olmoe", "qwen3_5_moe", "lfm2_moe", "granite_moe", "gpt_oss", "gemma4_moe"]


@pytest.fixture(scope="module", params=FAMILIES)
def moe_dir(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    make_tiny_model_dir: Callable[..., Path],
) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param)


@pytest.fixture(scope="module")
def reference(moe_dir: Path) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(moe_dir).eval()


def test_the_configs_route_as_their_families(moe_dir: Path) -> None:
    config = load_checkpoint(moe_dir).config
    experts = config.experts
    arch = config.architecture
    olmoe, qwen3_5, lfm2 = arch == "olmoe", arch == "qwen3_5", arch == "lfm2"
    granite, gpt_oss = arch == "granitemoehybrid", arch == "gpt_oss"
    gemma4 = arch == "gemma4"  # its experts beside the dense MLP, their router scaled
    assert experts is not None and experts.beside_mlp is gemma4
    assert experts is not None and experts.layers == tuple(range(lfm2, config.num_layers))
    assert (experts.num_experts, experts.experts_per_token, experts.intermediate_size) == (4, 2, 32)
    # the others rescale the chosen weights; OLMoE not, Granite's softmax over the k needs not
    assert experts.normalize is not (olmoe or granite or gpt_oss)
    qk_norm = not (olmoe or granite or gpt_oss)
    assert (config.qk_norm, config.projection_qk_norm) == (qk_norm, olmoe)
    assert (experts.shared_size, experts.shared_gate, experts.shared_is_mlp) == (
        (64, True, False) if qwen3_5 else (64, False, True) if granite else (None, False, False)
    )
    assert config.recurrent_layers == ((0, 2, 3) if qwen3_5 or lfm2 or granite else ())
    # LFM2-MoE: sigmoid scores, chosen with a bias, the rescaled sum under 1e-6; Granite: the
    # k highest logits, a softmax over them
    scoring = "sigmoid" if lfm2 else "topk_softmax" if granite or gpt_oss else "softmax"
    assert (experts.scoring, experts.expert_bias) == (scoring, lfm2)
    assert experts.norm_eps == (1e-6 if lfm2 else 0.0)
    # gpt-oss: a biased router and experts, the clamped gate; sinks, an output bias, and
    # sliding (a window of 4) and full layers alternating
    assert (experts.router_bias, experts.linear_biases) == (gpt_oss, gpt_oss)
    assert (experts.clamp, experts.alpha) == ((7.0, 1.702) if gpt_oss else (None, 1.0))
    assert (config.attention_sinks, config.output_bias) == (gpt_oss, gpt_oss)
    assert config.sliding_layers == ((0, 2) if gpt_oss or gemma4 else ())


def test_greedy_tokens_are_transformers_and_survive_a_prefix_hit(
    moe_dir: Path, reference: Any
) -> None:
    # a hybrid's hits need state checkpoints
    hybrid = bool(load_checkpoint(moe_dir).config.recurrent_layers)
    checkpoints: dict[str, Any] = {"state_checkpoints": 8, "state_checkpoint_interval": 2}
    engine = engine_of(moe_dir, **(checkpoints if hybrid else {}))
    first, _ = greedy(engine, [PROMPT])
    assert first["0"] == transformers_greedy(reference, PROMPT)
    shared = [*PROMPT[:16], 77, 78, 79]  # blocks 0-3 are PROMPT's
    second, _ = greedy(engine, [shared])
    assert engine.status().prefix_cache.hit_tokens == 16
    assert second["0"] == transformers_greedy(reference, shared)
    engine.check_blocks()


def test_its_gguf_reads_the_same_experts(
    moe_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    """llama.cpp's stacked experts (`ffn_*_exps`), router (`ffn_gate_inp`) and counts
    (`expert_count`, `expert_used_count`, `expert_feed_forward_length`); whether the weights
    are rescaled follows the family, as llama.cpp's graph fixes it."""
    path = write_tiny_gguf(moe_dir, tmp_path / "moe.gguf")
    assert load_checkpoint(path).config.experts == load_checkpoint(moe_dir).config.experts
    expected, _ = greedy(engine_of(moe_dir), [PROMPT])
    tokens, _ = greedy(engine_of(path), [PROMPT])
    assert tokens == expected


def test_a_dense_layer_among_routed_ones_matches_transformers(
    tmp_path: Path, make_tiny_model_dir: Callable[..., Path]
) -> None:
    """Qwen3-MoE's `mlp_only_layers`: layer 1 keeps a dense MLP of `intermediate_size`."""
    import transformers

    model_dir = make_tiny_model_dir(tmp_path, arch="qwen3_moe", mlp_only_layers=[1])
    checkpoint = load_checkpoint(model_dir)
    assert checkpoint.config.experts is not None and checkpoint.config.experts.layers == (0,)
    model = LlamaModel.from_tensors(checkpoint.config, checkpoint.tensors(), max_positions=128)
    assert model.layers[1].experts is None and model.layers[1].gate_up is not None
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    assert rel_error(paged_logits(model, PROMPT, 5), expected) < 1e-5


def test_olmoe_clipping_q_k_v_is_refused(
    tmp_path: Path, make_tiny_model_dir: Callable[..., Path]
) -> None:
    clipped = make_tiny_model_dir(tmp_path, arch="olmoe", clip_qkv=8.0)
    with pytest.raises(UnsupportedModelError, match=r"clip_qkv=8\.0 is not supported"):
        load_checkpoint(clipped)


def test_health_reports_the_experts_served_and_the_share_run(
    moe_dir: Path, tmp_path: Path, write_tiny_gguf: Callable[..., Path]
) -> None:
    """Through the boot path (`nanoserve serve`'s): the experts' types as stored, their bytes,
    and the share of those bytes run since boot, which a chat raises and never past 1."""
    from gguf import GGMLQuantizationType

    from nanoserve.api.server.health import Health
    from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
    from nanoserve.runtime.engine.serving.llm import LLM

    path = write_tiny_gguf(moe_dir, tmp_path / "q8.gguf", qtype=GGMLQuantizationType.Q8_0)
    llm = LLM(str(path), quantize="auto", dtype="auto", max_model_len=128, kv_budget_bytes=1 << 22)
    before = llm.engine.status().experts
    assert before is not None
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    llm.chat([{"role": "user", "content": "hello world"}], params)
    experts = Health.of(llm.engine.status()).experts
    assert experts is not None
    # layers x 4 experts x (gate, up, down): Q8_0 tensors of 32 x 64 (34 bytes a block)
    config = load_checkpoint(moe_dir).config
    assert config.experts is not None
    layers = len(config.experts.layers)
    assert experts["types"] == f"q8_0×{layers * 4 * 3}"
    assert experts["bytes"] == layers * 4 * 3 * 32 * 64 // 32 * 34
    assert (experts["experts"], experts["per_token"], experts["routed_layers"]) == (4, 2, layers)
    assert before["touched_share"] <= experts["touched_share"] <= 1.0
    assert experts["touched_share"] > 0.0


def test_gpt_oss_mxfp4_experts_read_as_stored_and_served_in_their_blocks(
    tmp_path: Path, make_tiny_model_dir: Callable[..., Path], write_tiny_gguf: Callable[..., Path]
) -> None:
    """gpt-oss's experts as its GGUFs store them (MXFP4: 32 E2M1 codes under one E8M0 scale):
    each expert's slice of the stack dequantizes as the gguf package does, and the file serves
    as its conversion does; in the `gguf` form (what `auto` picks) every linear runs in its
    MXFP4 blocks on the kernel, apart from torch's ops on those values by the int8 activations
    only."""
    import gguf
    import numpy as np

    model_dir = make_tiny_model_dir(tmp_path, arch="gpt_oss")
    path = write_tiny_gguf(
        model_dir, tmp_path / "mxfp4.gguf", qtype=gguf.GGMLQuantizationType.MXFP4
    )
    reader = gguf.GGUFReader(path)
    [stacked] = [t for t in reader.tensors if t.name == "blk.1.ffn_up_exps.weight"]
    assert stacked.tensor_type == gguf.GGMLQuantizationType.MXFP4
    want = gguf.quants.dequantize(np.asarray(stacked.data), stacked.tensor_type)[3]  # expert 3
    checkpoint = load_checkpoint(path)
    got = dict(checkpoint.tensors())["model.layers.1.mlp.experts.3.up_proj.weight"]
    assert torch.equal(got, torch.from_numpy(np.ascontiguousarray(want)).to(got.dtype))
    # served, it answers as its conversion to a directory does (transformers' stacked layout)
    from nanoserve.runtime.loading.convert import convert_gguf

    tokens, _ = greedy(engine_of(path), [PROMPT])
    converted, _ = greedy(engine_of(convert_gguf(path, tmp_path / "hf")), [PROMPT])
    assert tokens == converted
    # in its blocks: the experts' linears are MXFP4 on the kernel (/health's types)
    blocks = LlamaModel.from_tensors(
        checkpoint.config,
        checkpoint.sources(frozenset({"MXFP4"})),
        max_positions=128,
        quantize="gguf",
    )
    assert blocks.expert_usage is not None
    layers = len(checkpoint.config.experts.layers)  # type: ignore[union-attr]
    assert blocks.expert_usage.types == f"mxfp4×{layers * 4 * 3}"
    floats = LlamaModel.from_tensors(checkpoint.config, checkpoint.tensors(), max_positions=128)
    kernels, torch_ops = paged_logits(blocks, PROMPT), paged_logits(floats, PROMPT)
    assert rel_error(kernels, torch_ops) < 0.3  # test_architectures' gap (0.26 here)
    assert (kernels.argmax(-1) == torch_ops.argmax(-1)).float().mean() >= 0.85
