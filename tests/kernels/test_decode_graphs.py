"""The decode-graph path (padded static batches) gives the eager engine's tokens and counts.

On the CPU, MOESCOPE_DECODE_GRAPHS=1 runs that path without capturing (no CUDA here); on a
GPU the same test replays real CUDA graphs.
"""

from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_inputs import DEVICE

from engine import LLMEngine, SamplingParams
from engine.decode_graphs import SIZES
from engine.outputs import RequestOutput
from engine.telemetry import ExpertInfo

PROMPTS = [list(range(3, 30)), [5, 9, 3], [200, 17, 4, 4, 81], [7] * 12, [1, 2]]


def generate(
    monkeypatch: pytest.MonkeyPatch, graphs: bool, model: str, prompts: list[list[int]]
) -> tuple[list[RequestOutput], list[ExpertInfo], list[int]]:
    """Greedy outputs per request (request i generates 4 + i tokens, with log-probabilities),
    per-step expert telemetry, and the graph sizes captured."""
    monkeypatch.setenv("MOESCOPE_DECODE_GRAPHS", "1" if graphs else "0")
    monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", "triton")
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", "torch" if DEVICE.type == "cpu" else "triton")
    engine = LLMEngine(
        model=model, device=str(DEVICE), num_kv_blocks=24, block_size=8, max_num_seqs=8
    )
    ids = [
        engine.add_request(
            p, SamplingParams(max_tokens=4 + i, temperature=0, ignore_eos=True, logprobs=2)
        )
        for i, p in enumerate(prompts)
    ]
    outputs: dict[str, RequestOutput] = {}
    experts = []
    while engine.has_unfinished():
        step = engine.step()
        experts.append(step.telemetry.experts)
        for out in step.outputs:
            outputs[out.request_id] = out
    padded = engine.runner.graphs  # None where graphs are off
    captured = sorted({key[0] for key in padded.graphs}) if padded is not None else []
    return [outputs[i] for i in ids], experts, captured


def run(monkeypatch: pytest.MonkeyPatch, graphs: bool) -> tuple[list[list[int]], list, list]:
    """Greedy tokens per request, per-step expert counts, and the graph sizes captured."""
    outputs, experts, captured = generate(monkeypatch, graphs, "synthetic:tiny", PROMPTS)
    return [out.token_ids for out in outputs], [e.counts for e in experts], captured


@pytest.mark.slow
def test_graph_path_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    eager_tokens, eager_counts, _ = run(monkeypatch, graphs=False)
    graph_tokens, graph_counts, captured = run(monkeypatch, graphs=True)
    assert graph_tokens == eager_tokens
    assert [len(t) for t in graph_tokens] == [4, 5, 6, 7, 8]
    assert graph_counts == eager_counts  # padding rows are not counted
    # 5 decodes pad to 8, then 4, 3 -> 4, 2, 1 as requests finish
    assert captured == [1, 2, 4, 8] and set(captured) <= set(SIZES)


# contexts 6..13, 15..22, 7..13, 22..30 and 3..12 over blocks of 8: each crosses a boundary
MLA_PROMPTS = [list(range(3, 9)), [5, 9, 3] * 5, [7] * 7, list(range(40, 62)), [1, 2, 3]]


@pytest.mark.parametrize("model", ["synthetic:dsv2-lite", "deepseek_v3"])
def test_mla_graph_path_matches_eager(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: str
) -> None:
    """DeepSeek's MLA decodes through the padded path on the Triton MLA kernel (5 rows padded
    to 8, 3 to 4; padding rows write their latent into the scratch block) with the eager
    path's tokens, log-probabilities, expert counts and (V3's group routing) group counts."""
    import kernels.triton_mla

    if model == "deepseek_v3":  # q LoRA, YaRN, group-limited routing with a score bias
        pytest.importorskip("transformers")  # the GPU image (run_all.sh) has none
        from tests.engine.hf_checkpoints import make_deepseek_checkpoint

        model = str(make_deepseek_checkpoint(tmp_path, model))
    calls: list[int] = []
    kernel = kernels.triton_mla.mla_decode_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(args[0].shape[0])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(kernels.triton_mla, "mla_decode_attention", counted)
    eager, eager_experts, _ = generate(monkeypatch, False, model, MLA_PROMPTS)
    padded, padded_experts, captured = generate(monkeypatch, True, model, MLA_PROMPTS)
    assert captured == [1, 2, 4, 8]
    assert {8, 4} <= set(calls)  # the kernel ran on the padded batches
    assert [len(out.token_ids) for out in padded] == [4, 5, 6, 7, 8]
    for a, b in zip(eager, padded, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs is not None and b.logprobs is not None
        for pa, pb in zip(a.logprobs, b.logprobs, strict=True):
            assert pa.keys() == pb.keys()
            assert all(abs(pa[t] - pb[t]) < 1e-4 for t in pa)
    assert [e.counts for e in padded_experts] == [e.counts for e in eager_experts]
    assert [e.groups for e in padded_experts] == [e.groups for e in eager_experts]
    assert all(e.groups for e in padded_experts) == model.endswith("deepseek_v3")


def test_graphs_default_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.decode_graphs import graphs_enabled

    monkeypatch.delenv("MOESCOPE_DECODE_GRAPHS", raising=False)
    assert graphs_enabled(torch.device("cuda")) and not graphs_enabled(torch.device("cpu"))
    monkeypatch.setenv("MOESCOPE_DECODE_GRAPHS", "0")
    assert not graphs_enabled(torch.device("cuda"))
