"""Gemma 4's layer deltas as its `config.json` and its GGUF spell them.

Gemma 4 is Gemma 3's forward (sandwich norms, GeGLU, per-head q/k norms, sliding and full
layers) with these deltas, each a ModelConfig field:

- **Per-layer inputs** (`PerLayerInputs`): a second embedding table, [vocab, layers * width],
  whose slice for layer l, mixed with a projection of the first embedding, gates a small
  residual branch after layer l's MLP (model/per_layer_inputs.py).
- **Full layers of their own shape**: `global_head_dim` (512 against the sliding layers' 256)
  and, with `attention_k_eq_v`, their own K/V heads; with `attention_k_eq_v` a full layer has
  no V projection: its V is its K projection's output (normed apart, not rotated).
- **Proportional rotary** on the full layers: a quarter of each head's frequency pairs turn,
  at the exponents of the whole head; the rest stand still.
- **K/V sharing**: the last `num_kv_shared_layers` layers compute only q and read the K/V of
  the last earlier layer of their kind; they write none, so the pool has no layer for them.
  Their MLP is twice as wide with `use_double_wide_mlp`.
- V heads RMS-normed without a weight; attention's scale 1 (the q/k norms set it); each
  layer's output times a learned scalar; the final logits soft-capped.

A checkpoint with the vision and audio towers (model_type `gemma4`) is read for its
`text_config`, as Qwen3.5's is; the towers are skipped at load (hf_names.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nanoserve.runtime.errors import ConfigError, UnsupportedModelError


@dataclass(frozen=True, slots=True)
class PerLayerInputs:
    """The per-layer embedding: `vocab_size` rows of `width` values for each layer."""

    vocab_size: int
    width: int


def gemma4_fields(
    config_json: Mapping[str, Any], num_layers: int, kinds: list[str], source: str
) -> dict[str, Any]:
    """Gemma 4's ModelConfig fields from its `config.json`: the full layers' own shape (from
    `per_layer_config`, as transformers 5 writes it, or `global_head_dim` and
    `num_global_key_value_heads`), K/V sharing, per-layer inputs and the rest."""
    full = [i for i, kind in enumerate(kinds) if kind == "full"]
    k_eq_v = bool(config_json.get("attention_k_eq_v", False))
    head_dim = config_json.get("global_head_dim", 512)
    kv_heads = config_json.get("num_global_key_value_heads") if k_eq_v else None
    overrides = config_json.get("per_layer_config")
    if isinstance(overrides, Mapping) and full:
        first = overrides.get(str(full[0]), overrides.get(full[0])) or {}
        head_dim = first.get("head_dim", head_dim)
        kv_heads = first.get("num_key_value_heads", kv_heads)
    shared = config_json.get("num_kv_shared_layers") or 0
    if type(shared) is not int or not 0 <= shared < num_layers:
        raise ConfigError(source, f"num_kv_shared_layers={shared!r} must be in 0..{num_layers - 1}")
    width = config_json.get("hidden_size_per_layer_input") or 0
    per_layer = (
        PerLayerInputs(config_json.get("vocab_size_per_layer_input", 262_144), width)
        if width
        else None
    )
    softcap = config_json.get("final_logit_softcapping")
    rope = (config_json.get("rope_parameters") or {}).get("full_attention") or {}
    if rope.get("rope_type", "default") not in ("default", "proportional"):
        raise UnsupportedModelError(
            source, f"full layers' rope_type={rope['rope_type']!r} is not supported"
        )
    fraction = rope.get("partial_rotary_factor", 1.0) if rope.get("rope_type") else None
    return {
        "full_head_dim": head_dim,
        "full_kv_heads": kv_heads,
        "full_rope_fraction": float(fraction) if fraction is not None else None,
        "shared_kv_layers": tuple(range(num_layers - shared, num_layers)),
        "k_eq_v": k_eq_v,
        "v_norm": True,
        "double_wide_mlp": bool(config_json.get("use_double_wide_mlp", False)),
        "per_layer_inputs": per_layer,
        "layer_scalar": True,
        "final_logit_softcap": float(softcap) if softcap is not None else None,
    }


def gemma4_gguf_fields(
    key: Callable[..., Any],
    num_layers: int,
    gguf_names: frozenset[str],
    freq_factors: tuple[float, ...] | None,
    vocab_size: int,
) -> dict[str, Any]:
    """Gemma 4's ModelConfig fields as llama.cpp's converter stores them: the sliding layers'
    head_dim as `key_length_swa` and the full ones' as `key_length`, K/V heads and MLP widths
    one per layer, the pattern a bool per layer, and proportional rotary as `rope_freqs` (1 for
    each pair that turns, 1e30 for each that stands still). A full layer without `attn_v`
    reads its K as V."""
    pattern = key("attention.sliding_window_pattern")
    sliding = tuple(i for i in range(num_layers) if pattern[i])
    full = [i for i in range(num_layers) if i not in sliding]
    kv_heads = key("attention.head_count_kv")
    per_layer = kv_heads if isinstance(kv_heads, list) else [kv_heads] * num_layers
    head_dim, full_head_dim = int(key("attention.key_length_swa")), int(key("attention.key_length"))
    widths = key("feed_forward_length")
    widths = widths if isinstance(widths, list) else [widths] * num_layers
    shared = int(key("attention.shared_kv_layers", 0))
    sharing = tuple(range(num_layers - shared, num_layers))
    fraction = None
    if freq_factors is not None:  # the pairs that turn lead, at factor 1
        fraction = 2 * sum(1 for f in freq_factors if f == 1.0) / full_head_dim
    num_kv = int(per_layer[sliding[0]]) if sliding else int(per_layer[0])
    full_kv = int(per_layer[full[0]]) if full else num_kv
    width = int(key("embedding_length_per_layer_input", 0))
    softcap = key("final_logit_softcapping", None)
    return {
        "intermediate_size": int(min(widths)),
        "num_kv_heads": num_kv,
        "head_dim": head_dim,
        "hidden_act": "gelu_tanh",
        "qk_norm": True,
        "sandwich_norm": True,
        "embedding_multiplier": float(key("embedding_length")) ** 0.5,
        "query_scale": 1.0,
        "sliding_window": int(key("attention.sliding_window")),
        "sliding_layers": sliding,
        "sliding_rope_theta": float(key("rope.freq_base_swa", 10_000.0)),
        "full_head_dim": full_head_dim,
        "full_kv_heads": full_kv if full_kv != num_kv else None,
        "full_rope_fraction": fraction,
        "shared_kv_layers": sharing,
        "k_eq_v": any(f"blk.{i}.attn_v.weight" not in gguf_names for i in full if i not in sharing),
        "v_norm": True,
        "double_wide_mlp": any(widths[i] == 2 * min(widths) for i in sharing),
        "per_layer_inputs": PerLayerInputs(vocab_size, width) if width else None,
        "layer_scalar": "blk.0.layer_output_scale.weight" in gguf_names,
        "final_logit_softcap": float(softcap) if softcap else None,
    }
