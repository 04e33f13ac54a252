"""gpt-oss against transformers' own implementation, on tiny random checkpoints.

The checkpoint has non-zero sinks, router, expert and q/k/v/o biases, a SwiGLU limit that
bites, and a sliding layer whose window (5) is shorter than every prompt. Logits of every
computed row must match transformers run on the whole sequence: prefill, decode, chunked
prefill, prefix-cache hits and preemption; the MXFP4 checkpoint against its dequantized copy.
"""

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_checkpoints import (
    GPT_OSS_MXFP4,
    load_reference,
    make_gpt_oss_checkpoint,
    quantize_gpt_oss_experts,
    rewrite_config,
    rewrite_tensors,
)
from parity import (
    GREEDY,
    assert_matches_reference,
    check_chunked_prefill_and_prefix_hit,
    check_expert_parallel,
    check_preemption,
    check_prefill_and_decode,
    check_small_chunks,
    chunked_engine,
    prompts,
    recorded_engine,
    run,
)
from transformers import PreTrainedModel

from engine import LLM, LLMEngine, SamplingParams
from engine.config import engine_config
from engine.errors import InvalidInput
from engine.kv_cache import BlockManager
from engine.model import mxfp4
from engine.model.hf_config import model_config_from_hf
from engine.model.loader import sized_by_kv_memory
from engine.model.moe import MoEBlock
from engine.request import Request
from engine.telemetry import KVInfo
from engine.window_pool import WindowedBlocks
from kernels import triton_attention


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_gpt_oss_checkpoint(tmp_path_factory.mktemp("gpt_oss"), seed=3)


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> PreTrainedModel:
    return load_reference(checkpoint)


def test_config_maps_every_term(checkpoint: Path) -> None:
    cfg = model_config_from_hf(json.loads((checkpoint / "config.json").read_text()))
    assert cfg.family == "gpt_oss" and cfg.attention_sinks and cfg.gate_bias
    assert cfg.expert_bias and cfg.softmax_after_topk and cfg.qkv_bias and cfg.o_proj_bias
    assert cfg.swiglu_limit == 1.0 and cfg.swiglu_alpha == pytest.approx(1.702)
    assert [cfg.window(i) for i in range(3)] == [5, 0, 5]


def test_prefill_and_decode_match_transformers(
    checkpoint: Path, reference: PreTrainedModel
) -> None:
    """Whole prompts of 7, 13 and 21 tokens (all past the window), then batched decodes."""
    rec = check_prefill_and_decode(checkpoint, reference, [7, 13, 21], seed=1)
    assert [c.num_tokens for c in rec.steps[0]] == [7, 13, 21]


def test_yarn_rope_as_released_matches_transformers(tmp_path: Path) -> None:
    """The released checkpoints' rope: YaRN without truncation, past its original length."""
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 64,
    }
    path = make_gpt_oss_checkpoint(tmp_path, seed=5, rope_parameters=yarn)
    check_prefill_and_decode(path, load_reference(path), [13, 70], seed=1)


def test_chunked_prefill_and_prefix_hits_match_transformers(
    checkpoint: Path, reference: PreTrainedModel
) -> None:
    """Chunks of 5 over blocks of 4, arrivals while others decode, and a request that reads
    two full blocks of another's prompt from the prefix cache."""
    check_chunked_prefill_and_prefix_hit(checkpoint, reference, [7, 11, 6], seed=2)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_matches_transformers(
    checkpoint: Path, reference: PreTrainedModel, mode: str
) -> None:
    """Four requests in a pool of 12 blocks of 4: some are preempted and resumed."""
    _, preempted = check_preemption(
        checkpoint,
        reference,
        [9, 10, 7, 11],
        seed=4,
        num_kv_blocks=12,
        num_host_blocks=32,
        preemption_mode=mode,
        prefill_chunk_size=8,
        max_num_batched_tokens=32,
        max_num_seqs=4,
    )
    assert preempted > 0


@pytest.mark.parametrize("backend", ["loop", "torch", "onednn", "native", "triton"])
def test_moe_backends_match_transformers(
    checkpoint: Path, reference: PreTrainedModel, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", backend)
    check_small_chunks(checkpoint, reference, [9, 6], seed=5)


def test_triton_attention_matches_transformers(
    checkpoint: Path, reference: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode attention in the Triton kernel (under the interpreter on the CPU)."""
    monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", "triton")
    kernel = triton_attention.paged_decode_attention
    windows: list[int] = []

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        assert kwargs["sinks"] is not None
        windows.append(kwargs["window"])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(triton_attention, "paged_decode_attention", spy)
    engine, rec = recorded_engine(checkpoint, block_size=4, prefill_chunk_size=0)
    outputs = run(engine, [(0, p) for p in prompts([8, 12], seed=6)], GREEDY)
    assert set(windows) == {0, 5}
    assert_matches_reference(reference, rec, outputs, block=4)


def test_telemetry_counts_blocks_behind_the_window(checkpoint: Path) -> None:
    """Window 5, blocks of 4: with n tokens computed, the next token's window starts at
    position n - 4, so the (n - 4) // 4 blocks before it are given back by the sliding
    layers' pool (saved) while the full layer's pool keeps all ceil(n / 4)."""
    engine = LLMEngine(model=str(checkpoint), num_kv_blocks=32, block_size=4)
    engine.add_request(prompts([21], seed=11)[0], SamplingParams(max_tokens=8, ignore_eos=True))
    kv = [engine.step().telemetry.kv for _ in range(5)]
    assert [k.behind_window for k in kv] == [(n - 4) // 4 for n in range(21, 26)]
    assert [k.used for k in kv] == [-(-n // 4) for n in range(21, 26)]
    assert [k.window_used for k in kv] == [-(-n // 4) - (n - 4) // 4 for n in range(21, 26)]
    assert {k.window_total for k in kv} == {32}


def test_shared_prefix_blocks_count_once_in_both_pools() -> None:
    """Two requests share their first 8 tokens' blocks: the longer one gave back blocks
    0..3 of the window pool (hashed, so cached), the shorter one's hit of 2 blocks takes
    block 1 back from that cache for its window. Full pool: 5 + 1 used; window pool: the
    longer one's block 4 and the shorter one's 1 and 2: 3 blocks saved."""
    bm = WindowedBlocks(32, 32, 4, 0, True, 5)
    long, short = (
        Request(list(range(n)), SamplingParams(max_tokens=4), request_id=str(n)) for n in (20, 9)
    )
    for r in (long, short):
        bm.admit(r, bm.prefix_match(r))
        bm.allocate(r, r.num_tokens - r.num_computed_tokens)
        r.num_computed_tokens = r.num_tokens
        bm.register_full_blocks(r)
    assert short.block_table[:2] == long.block_table[:2]
    assert short.window_table[1] == bm.pool.hash_to_block[long.block_hashes[1]]
    assert (long.window_first, short.window_first) == (4, 1)
    kv = bm.stats([long, short])
    assert (kv.used, kv.window_used, kv.behind_window) == (6, 3, 3)
    assert BlockManager(32, 4, 0).stats([long, short]).behind_window == 0  # no sliding layer


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_window_pool_stays_bounded_and_matches_transformers(
    checkpoint: Path, reference: PreTrainedModel, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Contexts of up to 9 windows, chunked prefill, a prefix hit: the window pool holds at
    most each request's window, its chunk and a block it straddles, while the full pool
    grows with the contexts, and the logits still match transformers."""
    monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", backend)
    engine, rec = chunked_engine(checkpoint, chunk=6, seqs=3, enable_prefix_caching=True)
    kvs: list[KVInfo] = []
    a, b = prompts([26, 31], seed=8)
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    arrivals = [(0, a), (1, b), (12, a[:24] + b[:5])]
    outputs = run(engine, arrivals, params, on_step=lambda r: kvs.append(r.telemetry.kv))
    assert min(rec.rows[list(outputs)[-1]]) == 24, "the shared prefix was recomputed"
    per_request = -(-(5 + 6) // 4) + 1
    assert max(k.window_used for k in kvs) <= 3 * per_request
    assert max(k.used for k in kvs) >= 2 * max(k.window_used for k in kvs)
    assert max(k.behind_window for k in kvs) >= 10
    assert_matches_reference(reference, rec, outputs, block=4)


def test_window_pool_through_decode_graphs_matches_transformers(
    checkpoint: Path, reference: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode-graph path (padded static buffers, run eagerly on the CPU) with the
    sliding layers' own tables, index and scratch block: every step's logits match the
    eager forward (LogitRecorder) and transformers."""
    monkeypatch.setenv("MOESCOPE_DECODE_GRAPHS", "1")
    monkeypatch.setenv("MOESCOPE_ATTN_BACKEND", "triton")
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", "torch")
    engine, rec = recorded_engine(checkpoint, block_size=4, prefill_chunk_size=8, max_num_seqs=3)
    assert engine.runner.graphs is not None and engine.runner.graphs.window_tables is not None
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = run(engine, [(0, p) for p in prompts([9, 14, 5], seed=12)], params)
    assert_matches_reference(reference, rec, outputs, block=4)


def test_window_pool_under_overlap_gives_the_same_tokens(checkpoint: Path) -> None:
    """With overlap, blocks are given back while the step before may still read them
    (they go to another request only in a later step): tokens as without overlap."""
    prompt_ids = prompts([23, 9, 17, 30], seed=13)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    tokens = []
    for overlap in (False, True):
        engine = LLMEngine(
            model=str(checkpoint),
            num_kv_blocks=40,
            block_size=4,
            prefill_chunk_size=6,
            max_num_batched_tokens=12,
            max_num_seqs=4,
            overlap=overlap,
            threads=1,
        )
        assert engine.config.cache.window_blocks == 4 * (-(-(5 + 12) // 4) + 1)
        outputs = run(engine, [(2 * i, p) for i, p in enumerate(prompt_ids)], params)
        tokens.append([o.token_ids for o in outputs.values()])
    assert tokens[0] == tokens[1]


def test_a_budget_the_window_pool_cannot_hold_is_refused(checkpoint: Path) -> None:
    """One slot and 8 tokens a step: the pool holds 5 blocks of 4 (the window of 5 and a
    step of 8, and one straddled), so a step of up to 11 tokens still fits, 12 does not."""
    engine = LLMEngine(
        model=str(checkpoint),
        num_kv_blocks=64,
        block_size=4,
        max_num_seqs=1,
        max_num_batched_tokens=8,
    )
    assert engine.config.cache.window_blocks == 5
    engine.update_knobs(max_num_batched_tokens=11)
    with pytest.raises(InvalidInput, match="sliding layers"):
        engine.update_knobs(max_num_batched_tokens=12)


def test_kv_memory_buys_more_full_blocks_with_the_window_pool(checkpoint: Path) -> None:
    """The same MiB: the sliding layers' pool is sized first, the full layer takes the rest,
    so it holds more blocks than when every layer held every block; the caches fit."""
    args: dict[str, Any] = dict(
        kv_cache_memory_mib=1, block_size=4, max_num_seqs=2, max_num_batched_tokens=8
    )
    one_pool = sized_by_kv_memory(engine_config(str(checkpoint), **args)).cache.num_blocks
    engine = LLMEngine(model=str(checkpoint), **args)
    cache = engine.config.cache
    assert cache.window_blocks == 2 * (-(-(5 + 8) // 4) + 1)
    assert cache.num_blocks > 2 * one_pool  # 2 of the 3 layers slide
    caches = engine.model.kv_caches()
    window, full = cache.window_blocks, cache.num_blocks
    assert [c[0].shape[0] for c in caches] == [window, full, window]
    assert sum(t.numel() * t.element_size() for c in caches for t in c) <= 2**20


def test_each_term_counts(checkpoint: Path, tmp_path: Path) -> None:
    """Zeroing the sinks, the router bias or the expert biases changes the logits."""
    prompt = prompts([12], seed=7)[0]
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)

    def top_logprobs(path: Path) -> dict[int, float]:
        [out] = LLM(model=str(path), num_kv_blocks=16).generate([prompt], params, use_tqdm=False)
        assert out.logprobs is not None
        return out.logprobs[0]

    def zero(suffix: str) -> Callable[[dict[str, torch.Tensor]], None]:
        def edit(tensors: dict[str, torch.Tensor]) -> None:
            for key in tensors:
                if key.endswith(suffix):
                    tensors[key].zero_()

        return edit

    base = top_logprobs(checkpoint)
    for suffix in ("sinks", "router.bias", "experts.down_proj_bias"):
        path = tmp_path / suffix
        shutil.copytree(checkpoint, path)
        rewrite_tensors(path, zero(suffix))
        assert top_logprobs(path) != pytest.approx(base, abs=1e-4), suffix


def test_mxfp4_checkpoint_matches_its_dequantized_reference(tmp_path: Path) -> None:
    dense = make_gpt_oss_checkpoint(tmp_path, "dense", seed=8, **GPT_OSS_MXFP4)
    packed = tmp_path / "mxfp4"
    quantize_gpt_oss_experts(dense, packed)
    engine, rec = chunked_engine(packed, chunk=6, budget=12)
    block = engine.model.decoder_layers[1].mlp
    assert isinstance(block, MoEBlock)
    torch.testing.assert_close(
        block.w_gate_up.data.view(8, 64, 2, 32).transpose(2, 3).flatten(2),
        load_reference(dense).model.layers[1].mlp.experts.gate_up_proj.data,
        rtol=0,
        atol=0,
    )
    outputs = run(engine, [(0, p) for p in prompts([9, 14], seed=9)], GREEDY)
    assert_matches_reference(load_reference(dense), rec, outputs, block=4)


def test_mxfp4_without_scales_is_refused(tmp_path: Path) -> None:
    dense = make_gpt_oss_checkpoint(tmp_path, "dense", seed=8, **GPT_OSS_MXFP4)
    packed = tmp_path / "mxfp4"
    quantize_gpt_oss_experts(dense, packed)
    rewrite_tensors(packed, lambda t: t.pop("model.layers.0.mlp.experts.down_proj_scales"))
    with pytest.raises(ValueError, match="MXFP4 tensors without a pair"):
        LLMEngine(model=str(packed))


def test_mxfp4_round_trip_is_exact_on_fp4_values() -> None:
    """Values already on the fp4 grid times a power of two survive quantize/dequantize."""
    gen = torch.Generator().manual_seed(0)
    grid = torch.tensor(mxfp4.E2M1)[torch.randint(0, 16, (2, 64, 3), generator=gen)]
    grid[:, 0, :] = 6.0  # every block's peak sits at fp4's largest value
    grid[:, 32, :] = -6.0
    weight = grid * 2.0**-3
    blocks, scales = mxfp4.quantize(weight)
    assert blocks.shape == (2, 3, 2, 16) and scales.shape == (2, 3, 2)
    assert torch.equal(mxfp4.dequantize(blocks, scales), weight)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(layer_types=["sliding_attention"]), "layer_types"),
        (dict(layer_types=["local", "full_attention", "full_attention"]), "layer_types"),
        (dict(sliding_window=None), "sliding_window"),
        (dict(num_experts_per_tok=9), "num_experts_per_tok"),
        (dict(quantization_config={"quant_method": "gptq"}), "quant_method"),
    ],
)
def test_bad_configs_are_refused(
    checkpoint: Path, tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    path = tmp_path / "bad"
    shutil.copytree(checkpoint, path)
    rewrite_config(path, **changes)
    with pytest.raises(ValueError, match=message):
        LLMEngine(model=str(path))


@pytest.mark.slow
def test_expert_parallel_matches_transformers(checkpoint: Path, reference: PreTrainedModel) -> None:
    """Experts sharded over 2 real ranks (each rank picks its hosted experts' biases):
    log-probabilities and greedy tokens still follow transformers."""
    check_expert_parallel(checkpoint, reference, [7, 13], seed=10, steps=[0, 1])


@pytest.mark.parametrize(
    "key", ["model.layers.1.self_attn.sinks", "model.layers.2.mlp.experts.gate_up_proj_bias"]
)
def test_missing_tensor_is_named(checkpoint: Path, tmp_path: Path, key: str) -> None:
    path = tmp_path / "missing"
    shutil.copytree(checkpoint, path)
    rewrite_tensors(path, lambda tensors: tensors.pop(key))
    with pytest.raises(ValueError, match="missing tensors") as err:
        LLMEngine(model=str(path))
    assert key.removeprefix("model.").replace("experts.gate_up_proj_bias", "b_gate_up") in str(
        err.value
    )
