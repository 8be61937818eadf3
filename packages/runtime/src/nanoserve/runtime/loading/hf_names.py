"""The tensor names a family's Hugging Face checkpoint uses, mapped to the names the loader and
the forward use (Llama's): a family whose modules are named otherwise is a table here, not a
second loader. A name no table covers is kept as it is.

LFM2 calls its norms `operator_norm` and `ffn_norm`, its attention output `out_proj`, its
per-head norms `q_layernorm`/`k_layernorm`, its MLP `feed_forward.w1/w3/w2` (gate, up, down)
and its final norm `embedding_norm`; its convolution layers keep their own names
(`conv.in_proj`, `conv.conv`, `conv.out_proj`), which no other family has.

Granite 4.0-H calls its MLP `shared_mlp` (`input_linear`: gate and up as one; `output_linear`:
down), its router `block_sparse_moe.router.layer` (its experts are stacked: hf_stacked.py); its
Mamba2 layers keep their own names (`mamba.*`).

Qwen3.5 keeps Qwen's names (its DeltaNet layers' are `linear_attn.*`), but its checkpoint with a
vision tower nests the language model under `model.language_model.`, beside `model.visual.`
(the tower) and `mtp.` (multi-token-prediction heads): those two are parts the loader skips,
each named at boot, as vLLM's `--language-model-only` skips the tower. Gemma 4's checkpoint
with its towers nests it the same way, beside its vision and audio towers and embedders.
"""

from __future__ import annotations

import re

from nanoserve.runtime.loading.encoder_names import encoder_name, encoder_skipped_part

ENCODERS = ("bert", "nomic_bert")  # named by encoder_names.py

LFM2_NAMES: tuple[tuple[str, str], ...] = (
    (".operator_norm.", ".input_layernorm."),
    (".ffn_norm.", ".post_attention_layernorm."),
    (".self_attn.out_proj.", ".self_attn.o_proj."),
    (".self_attn.q_layernorm.", ".self_attn.q_norm."),
    (".self_attn.k_layernorm.", ".self_attn.k_norm."),
    (".feed_forward.w1.", ".mlp.gate_proj."),
    (".feed_forward.w3.", ".mlp.up_proj."),
    (".feed_forward.w2.", ".mlp.down_proj."),
)
GRANITE_NAMES: tuple[tuple[str, str], ...] = (
    (".shared_mlp.input_linear.", ".mlp.gate_up_proj."),
    (".shared_mlp.output_linear.", ".mlp.down_proj."),
    (".block_sparse_moe.router.layer.", ".mlp.gate."),  # the router (Tiny, Small)
)
RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "lfm2": LFM2_NAMES,
    "granitemoehybrid": GRANITE_NAMES,
    "gpt_oss": ((".mlp.router.", ".mlp.gate."),),  # its experts are stacked: hf_stacked.py
    # Gemma 4's experts block (26B-A4B): the router and its scales, the stacked experts
    "gemma4": (
        (".router.proj.", ".mlp.gate."),
        (".router.scale", ".mlp.router_scale"),
        (".router.per_expert_scale", ".mlp.expert_scale"),
        (".experts.", ".mlp.experts."),
    ),
}
PREFIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "qwen3_5": (("model.language_model.", "model."),),
    "gemma4": (("model.language_model.", "model."),),
}
# Parts of a checkpoint that are not the language model: skipped at load, named at boot.
SKIPPED_PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "qwen3_5": (("model.visual.", "vision tower"), ("mtp.", "MTP heads")),
    "gemma4": (
        ("model.vision_tower.", "vision tower"),
        ("model.audio_tower.", "audio tower"),
        ("model.embed_vision.", "vision embedder"),
        ("model.embed_audio.", "audio embedder"),
    ),
}
FINAL_NORMS: dict[str, str] = {"lfm2": "model.embedding_norm.weight"}


# A checkpoint saved from the base model (an embedder: `AutoModel`, not `...ForCausalLM`) names
# its tensors without the `model.` prefix.
BASE_MODEL_PARTS = ("embed_tokens.", "layers.", "norm.")


# LFM2-MoE's routed layers: `feed_forward.gate` (router), `.expert_bias`, `.experts.{e}.w1/w3/w2`
LFM2_EXPERT = re.compile(r"\.feed_forward\.experts\.(\d+)\.w([123])\.")
LFM2_EXPERT_PARTS = {"1": "gate_proj", "2": "down_proj", "3": "up_proj"}
HF_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.(gate|down|up)_proj\.")
LFM2_ROUTER_NAMES = (
    (".feed_forward.gate.", ".mlp.gate."),
    (".feed_forward.expert_bias", ".mlp.expert_bias"),
)


def canonical_name(architecture: str, name: str) -> str:
    """`name` as the loader knows it: the family's part renamed, the rest kept."""
    if architecture in ENCODERS:
        return encoder_name(name)
    if architecture == "lfm2" and (match := LFM2_EXPERT.search(name)):
        part = LFM2_EXPERT_PARTS[match[2]]
        return LFM2_EXPERT.sub(f".mlp.experts.{match[1]}.{part}.", name)
    for stored, known in LFM2_ROUTER_NAMES if architecture == "lfm2" else ():
        if stored in name:
            return name.replace(stored, known, 1)
    if name.startswith(BASE_MODEL_PARTS):
        name = "model." + name
    for stored, known in PREFIXES.get(architecture, ()):
        if name.startswith(stored):
            name = known + name.removeprefix(stored)
    if name == FINAL_NORMS.get(architecture):
        return "model.norm.weight"
    for stored, known in RENAMES.get(architecture, ()):
        if stored in name:
            return name.replace(stored, known, 1)
    return name


def skipped_part(architecture: str, name: str) -> str | None:
    """The part of the checkpoint a stored `name` belongs to when the loader skips it (Qwen3.5's
    "vision tower", "MTP heads"), else None."""
    if architecture in ENCODERS:
        return encoder_skipped_part(name)
    for prefix, part in SKIPPED_PARTS.get(architecture, ()):
        if name.startswith(prefix):
            return part
    return None


def family_name(architecture: str, name: str) -> str:
    """The loader's `name` as the family's checkpoints store it (what transformers loads): the
    inverse of `canonical_name`."""
    if name == "model.norm.weight" and architecture in FINAL_NORMS:
        return FINAL_NORMS[architecture]
    if architecture == "lfm2" and (match := HF_EXPERT.search(name)):
        number = {v: k for k, v in LFM2_EXPERT_PARTS.items()}[f"{match[2]}_proj"]
        return HF_EXPERT.sub(f".feed_forward.experts.{match[1]}.w{number}.", name)
    for stored, known in LFM2_ROUTER_NAMES if architecture == "lfm2" else ():
        if known in name:
            return name.replace(known, stored, 1)
    for stored, known in RENAMES.get(architecture, ()):
        if known in name:
            return name.replace(known, stored, 1)
    return name
