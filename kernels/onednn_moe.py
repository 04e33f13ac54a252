"""Expert FFN through oneDNN's inner product with weights packed once (CPU, float32).

torch's `grouped_mm` runs a float32 GEMM of a few rows per expert on one thread and reads
the weights as they are; oneDNN's inner product with prepacked weights (the op inductor's
CPU freezing uses) runs the same rows on every thread, 1.3-1.8x faster at 2-32 rows per
expert on this project's machine (benchmarks/RESULTS.md, "MoE layer"). The packed copies
are kept beside the weights (twice the experts' memory; kernels.packing).
"""

import torch
import torch.nn.functional as F

from kernels.packing import PackedWeights


def available() -> bool:
    return torch.backends.mkldnn.is_available()


def _pack(w: torch.Tensor) -> list[torch.Tensor]:
    """w [E, K, N] as E oneDNN weights [N, K] (an inner product's layout)."""
    return [w[e].t().contiguous().to_mkldnn() for e in range(w.shape[0])]


packed = PackedWeights(_pack)


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def expert_ffn_onednn(
    x_sorted: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """`expert_ffn` (kernels.grouped_gemm) with oneDNN: x_sorted [N, H] sorted by expert;
    w_gate_up [E, H, 2I]; w_down [E, I, H]; offsets [E] group ends."""
    gate_up, down = packed(w_gate_up), packed(w_down)
    out = torch.empty_like(x_sorted)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            gate, up = _linear(x_sorted[start:end], gate_up[e]).chunk(2, dim=-1)
            out[start:end] = _linear(F.silu(gate) * up, down[e])
        start = end
    return out
