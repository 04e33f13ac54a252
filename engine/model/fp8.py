"""FP8 checkpoints as DeepSeek-V3 ships them: `float8_e4m3fn` weights, each with a
`weight_scale_inv` of one float per block (128 x 128 by default), dequantized at load."""

from collections.abc import Iterator

import torch

SCALE_SUFFIX = "_scale_inv"  # `<name>.weight` is scaled by `<name>.weight_scale_inv`
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def dequantize(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """weight [out, in] in FP8 times its block's scale, as float32."""
    rows, cols = weight.shape
    scale = scale_inv.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return weight.float() * scale[:rows, :cols]


def quantize(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn weight, scale_inv per block): each block's largest magnitude maps to the
    format's largest finite value (how DeepSeek-V3's checkpoints were made; tests use it)."""
    rows, cols = weight.shape
    br, bc = -(-rows // block[0]), -(-cols // block[1])
    padded = weight.float().new_zeros(br * block[0], bc * block[1])
    padded[:rows, :cols] = weight.float()
    tiles = padded.view(br, block[0], bc, block[1])
    peak = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale_inv = peak / torch.finfo(torch.float8_e4m3fn).max
    q = (tiles / scale_inv[:, None, :, None]).view_as(padded)[:rows, :cols]
    return q.to(torch.float8_e4m3fn), scale_inv


class Dequantizer:
    """Pairs FP8 weights with their scales as a checkpoint's tensors stream by (in any order,
    across files) and hands back every other tensor unchanged."""

    def __init__(self, block: tuple[int, int]) -> None:
        self.block = block
        self.weights: dict[str, torch.Tensor] = {}
        self.scales: dict[str, torch.Tensor] = {}

    def feed(self, key: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors that `key` completes: itself, a dequantized weight, or none yet."""
        if key.endswith(SCALE_SUFFIX):
            name = key.removesuffix(SCALE_SUFFIX)
            self.scales[name] = tensor
        elif tensor.dtype in FP8_DTYPES:
            name = key
            self.weights[name] = tensor
        else:
            yield key, tensor
            return
        if name in self.weights and name in self.scales:
            weight, scale = self.weights.pop(name), self.scales.pop(name)
            yield name, self.dequantize(name, weight, scale)

    def dequantize(self, name: str, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        expected = [-(-n // b) for n, b in zip(weight.shape, self.block, strict=False)]
        if weight.dim() != 2 or list(scale.shape) != expected:
            raise ValueError(
                f"tensor {name + SCALE_SUFFIX!r} has shape {list(scale.shape)}, expected "
                f"{expected} for a {list(weight.shape)} weight in {list(self.block)} blocks"
            )
        return dequantize(weight, scale, self.block)

    def unpaired(self) -> list[str]:
        """FP8 weights without a scale and scales without a weight, once every file was read."""
        return sorted([*self.weights, *(f"{k}{SCALE_SUFFIX}" for k in self.scales)])
