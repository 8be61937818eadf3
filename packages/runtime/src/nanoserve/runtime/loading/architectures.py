"""The families nanoserve runs, by the name ModelConfig gives each, and the `model_type` a
Hugging Face config.json gives it."""

from __future__ import annotations

from typing import Literal, get_args

Architecture = Literal[
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma3",
    "gemma4",
    "smollm3",
    "phi3",
    "lfm2",
    "qwen3_5",
    "granitemoehybrid",
    "qwen3_moe",
    "olmoe",
    "gpt_oss",
    "bert",
    "nomic_bert",
]
ARCHITECTURES: tuple[Architecture, ...] = get_args(Architecture)
# config.json's model_type of each (Gemma 3's text-only checkpoints are "gemma3_text"; Qwen3.5's
# text model is "qwen3_5_text", and "qwen3_5" its multimodal form, whose text_config is read)
HF_MODEL_TYPES: dict[str, Architecture] = {
    **{
        arch: arch
        for arch in ARCHITECTURES
        if arch not in ("gemma3", "gemma4", "bert", "nomic_bert")
    },
    "gemma3_text": "gemma3",
    "gemma4_text": "gemma4",  # Gemma 4's text model ("gemma4", with its towers, is read for it)
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
    "lfm2_moe": "lfm2",  # LFM2-MoE: LFM2 with experts  # Qwen3.5-MoE: Qwen3.5 with experts (ModelConfig.experts)
}
