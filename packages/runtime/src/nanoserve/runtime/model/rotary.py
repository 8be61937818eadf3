"""The rotary maths of the forward: inverse frequencies, longrope's attention factor, and the
cos/sin tables a layer's rotary turns q and k by, exactly as transformers computes them."""

from __future__ import annotations

import math

import torch

from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.loading.rope import FreqFactors, LinearRope, LongRope, Yarn


def rope_inv_freq(
    config: ModelConfig,
    device: torch.device | str = "cpu",
    *,
    sliding: bool = False,
    positions: int | None = None,
) -> torch.Tensor:
    """Rotary inverse frequencies, `[rope_dim // 2]` float32, exactly as transformers computes
    them; `sliding`: a sliding layer's (its own base where the config has one, and then no
    scaling: Gemma 3's local layers); `positions`: the context served, which picks longrope's
    short or long divisors."""
    dim = config.rope_dim
    local_theta = config.sliding_rope_theta if sliding else None
    local = local_theta is not None
    theta = local_theta if local_theta is not None else config.rope_theta
    fraction = None if sliding else config.full_rope_fraction
    if not sliding and config.full_head_dim is not None:
        dim = config.full_head_dim  # Gemma 4's full layers: their own head_dim
    # Proportional rotary turns the first pairs only, at the whole head's exponents.
    turned = dim if fraction is None else 2 * int(fraction * dim // 2)
    # Same op order as transformers (int64 arange, then float32 division and power), so the bits agree.
    exponents = torch.arange(0, turned, 2, dtype=torch.int64, device=device).to(torch.float32) / dim
    inv_freq = 1.0 / (theta**exponents)
    if turned < dim:  # the pairs that stand still: frequency 0 (cos 1, sin 0)
        inv_freq = torch.cat((inv_freq, inv_freq.new_zeros((dim - turned) // 2)))
    s = None if local else config.rope_scaling
    if s is None:
        return inv_freq
    if isinstance(s, LinearRope):
        return inv_freq / s.factor
    if isinstance(s, FreqFactors):
        return inv_freq / torch.tensor(s.factors, dtype=torch.float32, device=device)
    if isinstance(s, Yarn):
        return yarn_inv_freq(s, theta**exponents, dim, float(theta))
    if isinstance(s, LongRope):
        served = positions or config.max_position_embeddings
        chosen = s.long_factor if served > s.original_max_position_embeddings else s.short_factor
        factors = torch.tensor(chosen, dtype=torch.float32, device=device)
        return 1.0 / (factors * theta**exponents)
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (beyond the original context) are slowed by `factor`; short ones untouched;
    # in between, a linear blend in 1/wavelength.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def yarn_inv_freq(s: Yarn, pos_freqs: torch.Tensor, dim: int, theta: float) -> torch.Tensor:
    """YaRN's blend of each frequency (extrapolated: itself) and itself over the factor
    (interpolated), by a ramp over the dimensions between the two correction bounds."""

    def bound(rotations: float) -> float:  # the dimension that turns `rotations` times
        turns = s.original_max_position_embeddings / (rotations * 2 * math.pi)
        return (dim * math.log(turns)) / (2 * math.log(theta))

    low, high = bound(s.beta_fast), bound(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    ramp = (torch.arange(dim // 2, dtype=torch.float32, device=pos_freqs.device) - low) / (
        high - low
    )
    extrapolated = 1 - torch.clamp(ramp, 0, 1)
    return (1.0 / (s.factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated


def rope_attention_factor(config: ModelConfig) -> float:
    """What cos and sin are multiplied by: longrope's or YaRN's attention factor, else 1."""
    s = config.rope_scaling
    return s.attention_factor if isinstance(s, LongRope | Yarn) else 1.0


def rotary_table(
    config: ModelConfig, positions: int, device: torch.device, *, sliding: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [positions, head_dim] float32 each, in the Hugging Face layout (the two
    halves of a head share a frequency), times longrope's attention factor where it has one."""
    inv_freq = rope_inv_freq(config, device, sliding=sliding, positions=positions)
    t = torch.arange(positions, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)  # [positions, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = 1.0 if sliding else rope_attention_factor(config)
    if scale == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * scale, emb.sin() * scale
