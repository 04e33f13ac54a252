"""End to end: a tiny engine on the Triton backends generates what the torch backends do."""

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from kernel_inputs import DEVICE

import kernels.triton_attention
import kernels.triton_moe
from engine import LLM, RequestOutput, SamplingParams

PROMPTS = [list(range(3, 40)), [5, 9, 3], [200, 17, 4, 4, 81, 9, 33, 2, 150, 64, 11]]


# torch's grouped_mm runs float32 on the CPU only; on CUDA the loop is the torch reference
TORCH_MOE = "torch" if DEVICE.type == "cpu" else "loop"


def generate(monkeypatch: pytest.MonkeyPatch, moe: str, attn: str) -> list[RequestOutput]:
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", moe)
    monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", attn)
    llm = LLM(
        model="synthetic:tiny",
        device=str(DEVICE),
        num_kv_blocks=32,
        block_size=8,
        prefill_chunk_size=16,
        max_num_batched_tokens=32,
        max_num_seqs=4,
    )
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
    return llm.generate(PROMPTS, params, use_tqdm=False)


def spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, calls: Counter[str]) -> None:
    """Count calls of module.name."""
    fn: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return fn(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


@pytest.mark.slow
def test_triton_backends_generate_the_torch_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[str] = Counter()
    spy(monkeypatch, kernels.triton_moe, "fused_moe", calls)
    spy(monkeypatch, kernels.triton_attention, "paged_decode_attention", calls)
    torch_out = generate(monkeypatch, TORCH_MOE, "torch")
    assert not calls
    triton_out = generate(monkeypatch, "triton", "triton")
    assert calls["fused_moe"] > 0 and calls["paged_decode_attention"] > 0
    for a, b in zip(torch_out, triton_out, strict=True):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 6
        assert a.logprobs is not None and b.logprobs is not None
        for pa, pb in zip(a.logprobs, b.logprobs, strict=True):
            assert pa.keys() == pb.keys()
            assert all(abs(pa[t] - pb[t]) < 1e-4 for t in pa)
