"""The decode-graph path (padded static batches) gives the eager engine's tokens and counts.

On the CPU, MOESCOPE_DECODE_GRAPHS=1 runs that path without capturing (no CUDA here); on a
GPU the same test replays real CUDA graphs.
"""

import pytest
import torch
from kernel_inputs import DEVICE

from engine import LLMEngine, SamplingParams
from engine.decode_graphs import SIZES

PROMPTS = [list(range(3, 30)), [5, 9, 3], [200, 17, 4, 4, 81], [7] * 12, [1, 2]]


def run(monkeypatch: pytest.MonkeyPatch, graphs: bool) -> tuple[list[list[int]], list, list]:
    """Greedy tokens per request, per-step expert counts, and the graph sizes captured."""
    monkeypatch.setenv("MOESCOPE_DECODE_GRAPHS", "1" if graphs else "0")
    monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", "triton")
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", "torch" if DEVICE.type == "cpu" else "triton")
    engine = LLMEngine(
        model="synthetic:tiny", device=str(DEVICE), num_kv_blocks=24, block_size=8, max_num_seqs=8
    )
    ids = [
        engine.add_request(p, SamplingParams(max_tokens=4 + i, temperature=0, ignore_eos=True))
        for i, p in enumerate(PROMPTS)
    ]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    counts = []
    while engine.has_unfinished():
        step = engine.step()
        counts.append(step.telemetry.experts.counts)
        for out in step.outputs:
            tokens[out.request_id] = out.token_ids
    captured = sorted({key[0] for key in engine.runner.graphs.graphs} if graphs else set())
    return [tokens[i] for i in ids], counts, captured


@pytest.mark.slow
def test_graph_path_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    eager_tokens, eager_counts, _ = run(monkeypatch, graphs=False)
    graph_tokens, graph_counts, captured = run(monkeypatch, graphs=True)
    assert graph_tokens == eager_tokens
    assert [len(t) for t in graph_tokens] == [4, 5, 6, 7, 8]
    assert graph_counts == eager_counts  # padding rows are not counted
    # 5 decodes pad to 8, then 4, 3 -> 4, 2, 1 as requests finish
    assert captured == [1, 2, 4, 8] and set(captured) <= set(SIZES)


def test_graphs_default_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.decode_graphs import graphs_enabled

    monkeypatch.delenv("MOESCOPE_DECODE_GRAPHS", raising=False)
    assert graphs_enabled(torch.device("cuda")) and not graphs_enabled(torch.device("cpu"))
    monkeypatch.setenv("MOESCOPE_DECODE_GRAPHS", "0")
    assert not graphs_enabled(torch.device("cuda"))
