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
from kernels.swiglu import ExpertTerms, glu


def available() -> bool:
    return torch.backends.mkldnn.is_available()


def _pack(w: torch.Tensor) -> list[torch.Tensor]:
    """w [E, K, N] as E oneDNN weights [N, K] (an inner product's layout)."""
    return [w[e].t().contiguous().to_mkldnn() for e in range(w.shape[0])]


packed = PackedWeights(_pack)


def _linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


def expert_ffn_onednn(
    x_sorted: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    offsets: torch.Tensor,
    terms: ExpertTerms | None = None,
) -> torch.Tensor:
    """`expert_ffn` (kernels.grouped_gemm) with oneDNN: x_sorted [N, H] sorted by expert;
    w_gate_up [E, H, 2I]; w_down [E, I, H]; offsets [E] group ends."""
    gate_up, down = packed(w_gate_up), packed(w_down)
    out = torch.empty_like(x_sorted)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            if terms is None:
                gate, up = _linear(x_sorted[start:end], gate_up[e]).chunk(2, dim=-1)
                out[start:end] = _linear(F.silu(gate) * up, down[e])
            else:  # oneDNN adds each expert's bias in the GEMM
                b_gate_up, b_down = _bias(terms.b_gate_up, e), _bias(terms.b_down, e)
                gate, up = _linear(x_sorted[start:end], gate_up[e], b_gate_up).chunk(2, dim=-1)
                out[start:end] = _linear(glu(gate, up, terms), down[e], b_down)
        start = end
    return out


def _bias(bias: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    return None if bias is None else bias[expert].contiguous()
