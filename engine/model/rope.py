"""Rotary frequencies with the rope scaling checkpoints ship: linear, llama3 and YaRN (as
transformers computes them), and DeepSeek's YaRN softmax-scale correction."""

import math

import torch

from engine.config import RopeScaling


def inv_freq(dim: int, theta: float, scaling: RopeScaling | None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [dim / 2], factor on cos and sin) for a rotary part of `dim`."""
    base = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    if scaling is None:
        return base, 1.0
    if scaling.rope_type == "linear":
        return base / scaling.factor, 1.0
    if scaling.rope_type == "llama3":
        return _llama3(base, scaling), 1.0
    return _yarn(dim, theta, scaling)


def _llama3(base: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Long wavelengths divided by the factor, short ones kept, the middle interpolated."""
    old = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > low_wavelen, base / s.factor, base)
    smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(dim: int, theta: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    """Interpolated low frequencies, extrapolated high ones, a linear ramp between
    (the correction range from beta_fast / beta_slow rotations)."""
    attention_factor = s.attention_factor
    if attention_factor is None:
        if s.mscale and s.mscale_all_dim:
            attention_factor = yarn_mscale(s.factor, s.mscale) / yarn_mscale(
                s.factor, s.mscale_all_dim
            )
        else:
            attention_factor = yarn_mscale(s.factor)
    old = s.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    freqs = (1 / (s.factor * pos_freqs)) * (1 - extrapolate) + (1 / pos_freqs) * extrapolate
    return freqs, float(attention_factor)


def softmax_scale_factor(scaling: RopeScaling | None) -> float:
    """DeepSeek's correction to the softmax scale under YaRN: mscale(factor, mscale_all_dim)^2."""
    if scaling is None or scaling.rope_type != "yarn" or not scaling.mscale_all_dim:
        return 1.0
    return yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2
