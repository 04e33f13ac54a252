"""MXFP4 expert weights as the released gpt-oss checkpoints store them, dequantized at load.

A weight `<name>` [E, out, in] is stored as `<name>_blocks` [E, out, in / 32, 16] uint8 (two
fp4 e2m1 values a byte, the low nibble first) and `<name>_scales` [E, out, in / 32] uint8
(one e8m0 exponent per 32 values: 2^(s - 127)); the model takes it as [E, in, out].

Dequantized at load, to float32 here and then to the engine's dtype with the rest of the
model (every fp4 value times a power of two is exact in bfloat16 too): every MoE backend
then runs gpt-oss unchanged, at 4x the weights' packed bytes. A kernel that reads the packed
blocks and unpacks them on the fly (a quarter of the bytes per decode step) is later work.
"""

from collections.abc import Iterator

import torch

BLOCKS, SCALES = "_blocks", "_scales"
VALUES = 32  # values per scale
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks [E, out, G, 16] uint8 and scales [E, out, G] uint8 as float32 [E, in, out]."""
    lut = torch.tensor(E2M1)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)
    values = values.flatten(-2)  # [E, out, G, 32]: low nibble, then high, per byte
    values = torch.ldexp(values, scales.long().unsqueeze(-1) - 127)
    return values.flatten(-2).transpose(1, 2).contiguous()


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [E, in, out] (in a multiple of 32) as (blocks, scales): each block's scale is the
    least power of two that brings its largest magnitude within fp4's 6, values rounded to the
    nearest fp4 value (for tests, which compare against what `dequantize` makes of it)."""
    w = weight.float().transpose(1, 2)
    experts, out, cols = w.shape
    tiles = w.reshape(experts, out, cols // VALUES, VALUES)
    peak = tiles.abs().amax(-1).clamp(min=2.0**-120)
    exponent = torch.ceil(torch.log2(peak / 6.0)).clamp(-127, 127)
    scaled = tiles / torch.pow(2.0, exponent).unsqueeze(-1)
    lut = torch.tensor(E2M1)
    codes = (scaled.unsqueeze(-1) - lut).abs().argmin(-1).to(torch.uint8)  # [E, out, G, 32]
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


class Mxfp4Dequantizer:
    """Pairs `_blocks` with their `_scales` as a checkpoint's tensors stream by (in any order,
    across files) and hands back every other tensor unchanged."""

    def __init__(self) -> None:
        self.blocks: dict[str, torch.Tensor] = {}
        self.scales: dict[str, torch.Tensor] = {}

    def feed(self, key: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors that `key` completes: itself, a dequantized weight, or none yet."""
        if key.endswith(BLOCKS) and tensor.dtype == torch.uint8:
            name = key.removesuffix(BLOCKS)
            self.blocks[name] = tensor
        elif key.endswith(SCALES) and tensor.dtype == torch.uint8:
            name = key.removesuffix(SCALES)
            self.scales[name] = tensor
        else:
            yield key, tensor
            return
        if name in self.blocks and name in self.scales:
            blocks, scales = self.blocks.pop(name), self.scales.pop(name)
            if (
                blocks.dim() != 4
                or blocks.shape[-1] != VALUES // 2
                or blocks.shape[:-1] != scales.shape
            ):
                raise ValueError(
                    f"MXFP4 tensor {name!r}: blocks {list(blocks.shape)} and scales "
                    f"{list(scales.shape)} do not pair as [E, out, G, 16] and [E, out, G]"
                )
            yield name, dequantize(blocks, scales)

    def unpaired(self) -> list[str]:
        """Names whose blocks or scales never arrived."""
        return sorted({*self.blocks, *self.scales})
