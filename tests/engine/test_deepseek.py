"""DeepSeek-V2 / V3 against transformers on tiny random checkpoints: MLA over a latent cache,
group-limited and `noaux_tc` routing, ungated shared experts, dense first layers, YaRN, FP8
weights; and the pieces (routing, rope scaling) against transformers' own functions."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hf_checkpoints import (
    DEEPSEEK_SPECS,
    load_reference,
    make_checkpoint,
    make_deepseek_checkpoint,
    rewrite_config,
)
from parity import (
    GREEDY,
    assert_logprobs_match_reference,
    cached_reference,
    check_chunked_prefill_and_prefix_hit,
    check_preemption,
    check_prefill_and_decode,
    check_small_chunks,
    prompts,
    run,
)
from safetensors.torch import load_file, save_file
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from benchmarks.speed import mla_vs_gqa
from engine import LLMEngine, SamplingParams
from engine.config import ModelConfig, RopeScaling
from engine.model.fp8 import quantize
from engine.model.hf_config import model_config_from_hf
from engine.model.mla import MLAttention
from engine.model.rope import inv_freq
from engine.model.routing import route_grouped
from server.engine_info import engine_description
from server.fit_seed import differences

NAMES = list(DEEPSEEK_SPECS)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("deepseek")
    return {name: make_deepseek_checkpoint(root, name, seed=i) for i, name in enumerate(NAMES)}


@pytest.mark.parametrize("name", NAMES)
def test_prefill_and_decode_match_transformers(checkpoints: dict[str, Path], name: str) -> None:
    """Whole prompts in one step, then decodes over the latent cache (absorbed projections)."""
    path = checkpoints[name]
    rec = check_prefill_and_decode(path, cached_reference(path), [7, 13, 21], seed=len(name))
    assert all(not any(c.is_prefill for c in s) for s in rec.steps[1:])


@pytest.mark.parametrize("name", NAMES)
def test_chunked_prefill_and_prefix_hits_match_transformers(
    checkpoints: dict[str, Path], name: str
) -> None:
    """Chunks of 5 over blocks of 4, mixed steps, and a request that reads two full blocks of
    latents another request wrote (a prefix-cache hit)."""
    path = checkpoints[name]
    check_chunked_prefill_and_prefix_hit(path, cached_reference(path), [7, 11, 6], seed=len(name))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_matches_transformers(checkpoints: dict[str, Path], mode: str) -> None:
    """Too few blocks for three growing requests: some are preempted (their latents dropped
    and recomputed, or swapped to the host and back) and still follow transformers."""
    path = checkpoints["deepseek_v3"]
    outputs, _ = check_preemption(
        path,
        cached_reference(path),
        [9, 8, 7],
        seed=4,
        num_kv_blocks=9,
        preemption_mode=mode,
        enable_prefix_caching=False,
    )
    assert sum(out.num_preemptions for out in outputs.values()) > 0


def test_latent_cache_holds_kv_lora_rank_plus_rope_per_token(
    checkpoints: dict[str, Path],
) -> None:
    engine = LLMEngine(model=str(checkpoints["deepseek_v3"]), num_kv_blocks=8, block_size=4)
    cfg = engine.model_config
    assert cfg.kv_elements_per_token == 16 + 4  # kv_lora_rank + qk_rope_head_dim
    caches = engine.model.kv_caches()
    assert len(caches) == cfg.num_layers
    assert all(len(c) == 1 and c[0].shape == (8, 4, 20) for c in caches)
    attn = engine.model.decoder_layers[0].self_attn
    assert isinstance(attn, MLAttention)


def test_fp8_checkpoint_matches_its_dequantized_reference(tmp_path: Path) -> None:
    """Block-scaled float8_e4m3fn weights (8 x 8 blocks, partial ones at the edges): loaded
    and dequantized, the model follows transformers on the dequantized weights."""
    ref_path = make_deepseek_checkpoint(tmp_path, "deepseek_v3", seed=7)
    fp8_path = tmp_path / "fp8"
    shutil.copytree(ref_path, fp8_path)
    block = (8, 8)
    tensors = load_file(ref_path / "model.safetensors")
    quantized = {}
    for key, w in tensors.items():
        if w.dim() == 2 and "proj" in key:  # DeepSeek keeps embeddings, router, norms as is
            q, scale_inv = quantize(w, block)
            tensors[key] = (
                q.float()
                * scale_inv.repeat_interleave(8, 0).repeat_interleave(8, 1)[
                    : w.shape[0], : w.shape[1]
                ]
            )
            quantized[key], quantized[f"{key}_scale_inv"] = q, scale_inv
    assert len(quantized) > 40
    save_file(tensors, ref_path / "model.safetensors", metadata={"format": "pt"})
    save_file({**tensors, **quantized}, fp8_path / "model.safetensors", metadata={"format": "pt"})
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(block)}
    rewrite_config(fp8_path, quantization_config=quant)
    check_small_chunks(fp8_path, load_reference(ref_path), [9, 5], seed=8)


def test_fp8_weight_without_its_scale_is_named(tmp_path: Path) -> None:
    path = make_deepseek_checkpoint(tmp_path, "deepseek_v2", seed=1)
    tensors = load_file(path / "model.safetensors")
    key = "model.layers.0.self_attn.o_proj.weight"
    tensors[key] = quantize(tensors[key], (8, 8))[0]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="FP8 tensors without a pair") as err:
        LLMEngine(model=str(path))
    assert key in str(err.value)


@pytest.mark.parametrize(
    "distributed", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["modeled", "ranks"]
)
def test_expert_parallel_covers_moe_layers_by_their_real_index(
    checkpoints: dict[str, Path], distributed: bool
) -> None:
    """`--ep 2`, modeled or over two real ranks (routed experts sharded; MLA, the dense layer
    and the shared experts on both): the placement and the expert telemetry hold the MoE
    layers only (1 and 2; layer 0 is dense), and log-probabilities still follow
    transformers."""
    path = checkpoints["deepseek_v3"]
    engine = LLMEngine(
        model=str(path),
        num_kv_blocks=64,
        block_size=4,
        ep_size=2,
        ep_distributed=distributed,
    )
    assert engine.model_config.moe_layers == [1, 2]
    assert len(engine.runner.placement.layers) == 2
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=3)
    for prompt in prompts([9, 6], seed=6):
        engine.add_request(prompt, params)
    try:
        steps = [engine.step()]
        while engine.has_unfinished():
            steps.append(engine.step())
    finally:
        engine.close()
    first = steps[0].telemetry.experts
    assert first.layers == 2 and [sum(row) for row in first.counts] == [15 * 2] * 2
    outputs = {o.request_id: o for step in steps for o in step.outputs if o.finished}
    assert len(outputs) == 2
    assert_logprobs_match_reference(cached_reference(path), outputs)


# the pieces against transformers' own functions


def _router_config(method: str, norm: bool) -> Any:  # stands in for transformers' config
    return SimpleNamespace(
        num_experts_per_tok=3,
        num_experts=16,
        num_local_experts=16,
        hidden_size=12,
        routed_scaling_factor=1.7,
        topk_method=method,
        n_group=4,
        topk_group=2,
        norm_topk_prob=norm,
    )


@pytest.mark.parametrize(
    ("method", "norm"),
    [("greedy", False), ("group_limited_greedy", False), ("noaux_tc", True), ("noaux_tc", False)],
)
def test_routing_matches_transformers_routers(method: str, norm: bool) -> None:
    hf = _router_config(method, norm)
    router = DeepseekV3TopkRouter(hf) if method == "noaux_tc" else DeepseekV2TopkRouter(hf)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(16, 12, generator=gen))
        if method == "noaux_tc":
            router.e_score_correction_bias.copy_(torch.randn(16, generator=gen))  # type: ignore[operator]
    x = torch.randn(64, 12, generator=gen)
    _, want_w, want_e = router(x)
    cfg = ModelConfig(
        family="deepseek_v3" if method == "noaux_tc" else "deepseek_v2",
        vocab_size=8,
        hidden_size=12,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=4,
        moe_intermediate_size=4,
        num_experts=16,
        top_k=3,
        norm_topk_prob=norm,
        topk_method=method,  # type: ignore[arg-type]
        n_group=4,
        topk_group=2,
        routed_scaling_factor=1.7,
    )
    bias = getattr(router, "e_score_correction_bias", None)
    weights, experts, groups = route_grouped(x @ router.weight.T, cfg, bias)
    order, want_order = experts.argsort(-1), want_e.argsort(-1)
    assert torch.equal(experts.gather(1, order), want_e.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_w.gather(1, want_order))
    if method == "greedy":
        assert groups is None
    else:
        assert groups is not None and groups.sum(1).eq(2).all()
        assert (groups.repeat_interleave(4, 1).gather(1, experts) == 1).all()


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "linear", "factor": 3.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        YARN_PARAMS := {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 64,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        {**YARN_PARAMS, "mscale": None, "mscale_all_dim": None, "truncate": False},
    ],
)
def test_rope_scaling_matches_transformers(params: dict[str, object]) -> None:
    hf = SimpleNamespace(
        rope_parameters={**{k: v for k, v in params.items() if v is not None}, "rope_theta": 1e4},
        head_dim=32,
        hidden_size=128,
        num_attention_heads=4,
        max_position_embeddings=512,
        standardize_rope_params=lambda: None,
    )
    want, want_factor = ROPE_INIT_FUNCTIONS[str(params["rope_type"])](hf, None)
    cfg = model_config_from_hf(
        {
            "model_type": "mixtral",
            "vocab_size": 8,
            "hidden_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_local_experts": 2,
            "intermediate_size": 8,
            "num_experts_per_tok": 1,
            "max_position_embeddings": 512,
            "rope_parameters": {**hf.rope_parameters},
        }
    )
    assert isinstance(cfg.rope_scaling, RopeScaling)
    freq, factor = inv_freq(32, 1e4, cfg.rope_scaling)
    torch.testing.assert_close(freq, want)
    assert factor == pytest.approx(want_factor)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "'dynamic'.*'rope_param"),
        (dict(topk_method="noaux"), "topk_method"),
        (dict(topk_method="group_limited_greedy", n_group=3), "n_group"),
        (dict(topk_method="group_limited_greedy", n_group=8, topk_group=1), "fewer than"),
        (dict(model_type="deepseek_v3", n_group=8, topk_group=4), "best two"),
        (dict(moe_layer_freq=2), "moe_layer_freq"),
    ],
)
def test_unsupported_deepseek_config_is_refused(
    checkpoints: dict[str, Path], changes: dict[str, object], message: str
) -> None:
    cfg = json.loads((checkpoints["deepseek_v2"] / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        model_config_from_hf({**cfg, **changes})


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
            "rope_theta": 1e4,
        },
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "rope_theta": 1e4,
        },
    ],
)
def test_rope_scaling_on_a_gqa_family_matches_transformers(tmp_path: Path, rope: dict) -> None:
    """linear, llama3 and YaRN (its cos/sin factor included) on Qwen3-MoE's rotate-half rope."""
    path = make_checkpoint(tmp_path, "qwen3_moe", seed=3)
    rewrite_config(path, rope_parameters=rope)
    check_prefill_and_decode(path, load_reference(path), [30, 11], seed=2, block=4)


def test_legacy_rope_scaling_key_is_read() -> None:
    cfg = model_config_from_hf(
        {
            "model_type": "mixtral",
            "vocab_size": 8,
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "intermediate_size": 8,
            "rope_scaling": {"type": "linear", "factor": 2.0},
        }
    )
    assert cfg.rope_scaling == RopeScaling("linear", 2.0)


def test_kv_bytes_per_token_in_the_engine_description(checkpoints: dict[str, Path]) -> None:
    """/api/status says what a token costs per layer: MLA's latent is 16 + 4 floats, a GQA
    layer's K and V 2 x 2 heads x 16."""
    mla = LLMEngine(model=str(checkpoints["deepseek_v3"]), num_kv_blocks=4)
    gqa = LLMEngine(model="synthetic:tiny", num_kv_blocks=4)
    described = [
        engine_description(SimpleNamespace(engine=e))["kv_bytes_per_token"]  # type: ignore[arg-type]
        for e in (mla, gqa)
    ]
    assert described == [
        {"per_layer": 20 * 4, "all_layers": 20 * 4 * 3, "layout": "latent"},
        {"per_layer": 2 * 2 * 16 * 4, "all_layers": 2 * 2 * 16 * 4 * 2, "layout": "kv"},
    ]
    for engine, per_layer in ((mla, 80), (gqa, 256)):
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=1))
        assert engine.step().telemetry.kv.bytes_per_token_layer == per_layer


def test_dsv2_lite_preset_runs_with_its_moe_layers_named() -> None:
    """The DeepSeek-V2-Lite-shaped preset: a dense first layer, MoE telemetry for layers
    1-5 only, a latent cache 3.6x smaller per token than its GQA twin's."""
    mla = LLMEngine(model="synthetic:dsv2-lite", num_kv_blocks=16, block_size=4)
    gqa = LLMEngine(model="synthetic:dsv2-lite-gqa", num_kv_blocks=16, block_size=4)
    assert mla.model_config.moe_layers == [1, 2, 3, 4, 5]
    assert (mla.model_config.kv_elements_per_token, gqa.model_config.kv_elements_per_token) == (
        72,
        256,
    )
    sizes = [sum(p.numel() for p in e.model.parameters()) for e in (mla, gqa)]
    assert abs(sizes[0] - sizes[1]) < 0.01 * sizes[1]
    mla.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=3, temperature=0.0))
    experts = mla.step().telemetry.experts
    assert experts.layers == 5 and [sum(row) for row in experts.counts] == [5 * 6] * 5


def test_telemetry_names_moe_layers_and_counts_chosen_groups(
    checkpoints: dict[str, Path],
) -> None:
    """Group-limited routing: each token chooses topk_group (2) of n_group (4) groups per MoE
    layer; the record counts them per group, for MoE layers 1 and 2 (layer 0 is dense)."""
    engine = LLMEngine(model=str(checkpoints["deepseek_v2_group"]), num_kv_blocks=16)
    engine.add_request([5, 6, 7, 8, 9, 10, 11], SamplingParams(max_tokens=2, temperature=0.0))
    experts = engine.step().telemetry.experts
    assert experts.moe_layers == [1, 2] and experts.layers == 2
    assert len(experts.groups) == 2 and all(len(row) == 4 for row in experts.groups)
    assert [sum(row) for row in experts.groups] == [7 * 2] * 2
    assert all(max(row) <= 7 for row in experts.groups)
    decode = engine.step().telemetry.experts
    assert [sum(row) for row in decode.groups] == [2, 2]
    greedy = LLMEngine(model=str(checkpoints["deepseek_v2"]), num_kv_blocks=16)
    greedy.add_request([5, 6, 7], SamplingParams(max_tokens=1))
    assert greedy.step().telemetry.experts.groups == []


def test_mla_vs_gqa_benchmark_quick_run() -> None:
    """The benchmark's smoke run: both arms decode, and the KV budget holds 1024 / 288 times
    as many tokens for MLA as for GQA (to the block)."""
    rows = mla_vs_gqa.main(["--quick", "--no-write"])["4x16"]
    assert set(rows) == {"MLA", "GQA", "MLA (A/A)"}
    assert [rows[a]["kv_bytes_per_token_layer"] for a in ("MLA", "GQA")] == [288, 1024]
    assert rows["MLA"]["blocks"] == 64 * 2**20 // (288 * 6 * 16)
    assert all(r["decode_tok_s"] > 0 for r in rows.values())


def test_rebalance_places_the_moe_layers_only(checkpoints: dict[str, Path]) -> None:
    """EPLB from a DeepSeek model's loads: one layer placement per MoE layer, and decoding
    goes on under it."""
    engine = LLMEngine(
        model=str(checkpoints["deepseek_v2_group"]), num_kv_blocks=32, block_size=4, ep_size=2
    )
    run(engine, [(0, p) for p in prompts([9, 6], seed=1)], GREEDY)
    before = engine.placement.version
    engine.rebalance(window=64, replicas=1)
    outputs = run(engine, [(0, prompts([5], seed=2)[0])], GREEDY)
    assert len(engine.placement.layers) == 2 and engine.placement.version == before + 1
    assert all(len(out.token_ids) == GREEDY.max_tokens for out in outputs.values())


def test_multi_token_prediction_layers_are_skipped(tmp_path: Path) -> None:
    """DeepSeek-V3 ships its MTP module as layer `num_hidden_layers`: decoding does not use
    it, so its tensors load as nothing (FP8 ones included)."""
    path = make_deepseek_checkpoint(tmp_path, "deepseek_v3", seed=2)
    tensors = load_file(path / "model.safetensors")
    q, scale_inv = quantize(torch.randn(32, 64), (8, 8))
    tensors["model.layers.3.eh_proj.weight"] = q
    tensors["model.layers.3.eh_proj.weight_scale_inv"] = scale_inv
    tensors["model.layers.3.enorm.weight"] = torch.ones(32)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    rewrite_config(path, quantization_config={"quant_method": "fp8", "weight_block_size": [8, 8]})
    engine = LLMEngine(model=str(path), num_kv_blocks=8, block_size=4)
    assert len(engine.model.decoder_layers) == 3


@pytest.mark.parametrize("backend", ["torch", "native", "loop", "triton"])
def test_moe_backends_match_transformers(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Scaled (routed_scaling_factor 2.5), renormalised DeepSeek weights through every CPU
    expert backend, beside the default's."""
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", backend)
    path = checkpoints["deepseek_v3"]
    check_small_chunks(path, cached_reference(path), [9, 2], seed=5)


def test_bf16_keeps_the_selection_bias_float32(checkpoints: dict[str, Path]) -> None:
    """In bfloat16 the experts run in bf16 but V3's e_score_correction_bias stays float32
    (as loaded), and the engine still decodes."""
    engine = LLMEngine(
        model=str(checkpoints["deepseek_v3"]), dtype="bfloat16", num_kv_blocks=16, block_size=4
    )
    [first, *_] = engine.model.moe_blocks
    assert first.w_gate_up.dtype == torch.bfloat16
    assert first.e_score_correction_bias is not None
    assert first.e_score_correction_bias.dtype == torch.float32
    want = load_file(checkpoints["deepseek_v3"] / "model.safetensors")
    assert torch.equal(
        first.e_score_correction_bias, want["model.layers.1.mlp.gate.e_score_correction_bias"]
    )
    outputs = run(engine, [(0, prompts([6], seed=1)[0])], GREEDY)
    assert all(len(out.token_ids) == GREEDY.max_tokens for out in outputs.values())


def test_kv_memory_budget_decides_the_blocks(checkpoints: dict[str, Path]) -> None:
    """`kv_cache_memory_mib`: 1 MiB buys 2^20 / (80 bytes x 3 layers x 16) latent blocks for
    the V3 checkpoint and 2^20 / (256 x 2 x 16) K/V blocks for synthetic:tiny."""
    mla = LLMEngine(model=str(checkpoints["deepseek_v3"]), kv_cache_memory_mib=1)
    gqa = LLMEngine(model="synthetic:tiny", kv_cache_memory_mib=1)
    assert mla.config.cache.num_blocks == 2**20 // (80 * 3 * 16) == mla.blocks.stats().total
    assert gqa.config.cache.num_blocks == 2**20 // (256 * 2 * 16)
    assert mla.model.kv_caches()[0][0].shape[0] == mla.config.cache.num_blocks
    with pytest.raises(ValueError, match="not both"):
        LLMEngine(model="synthetic:tiny", kv_cache_memory_mib=1, num_kv_blocks=8)
    with pytest.raises(ValueError, match="holds no block"):
        LLMEngine(model="synthetic:tiny", kv_cache_memory_mib=0.001)


def test_recordings_from_before_the_new_fields_still_seed_a_fit() -> None:
    """`--fit-from` compares model configs: a recording that predates the DeepSeek fields
    held their defaults, so it still matches; a real difference is still named."""
    engine = LLMEngine(model="synthetic:tiny")
    live = json.loads(json.dumps(engine_description(SimpleNamespace(engine=engine))))  # type: ignore[arg-type]
    old_model = {
        k: v for k, v in live["model_config"].items() if k not in ("kv_lora_rank", "rope_scaling")
    }
    assert differences({**live, "model_config": old_model}, live) == []
    changed = {**live["model_config"], "kv_lora_rank": 512}
    assert differences({**live, "model_config": changed}, live) == [
        "model_config.kv_lora_rank 512 (here 0)"
    ]


@pytest.mark.slow
def test_two_real_ranks_count_the_groups_one_process_does(checkpoints: dict[str, Path]) -> None:
    """Under 2 real expert-parallel ranks each routes its own rows: the record's group counts
    (and expert counts) are the sums over ranks, equal to one process's, prefill and decode."""
    seen = []
    for distributed in (False, True):
        engine = LLMEngine(
            model=str(checkpoints["deepseek_v2_group"]),
            num_kv_blocks=32,
            block_size=4,
            ep_size=2,
            ep_distributed=distributed,
        )
        engine.add_request([5, 6, 7, 8, 9, 10, 11], SamplingParams(max_tokens=2, temperature=0.0))
        engine.add_request([3, 4, 5], SamplingParams(max_tokens=2, temperature=0.0))
        steps = [engine.step().telemetry.experts for _ in range(2)]
        engine.close()
        seen.append([(e.groups, e.counts) for e in steps])
    assert [sum(row) for row in seen[1][0][0]] == [10 * 2] * 2  # 10 prompt rows, 2 groups each
    assert [sum(row) for row in seen[1][1][0]] == [2 * 2] * 2
    assert seen[1] == seen[0]
