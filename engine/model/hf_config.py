"""A Hugging Face config.json mapped onto ModelConfig for every family moescope runs, refusing
what the model cannot run."""

from typing import Any

from engine.config import Family, ModelConfig, TopkMethod
from engine.model.hf_fields import bool_field, field, first_set, int_field, number_field, refuse
from engine.model.hf_rope import rope_scaling, rope_theta

FAMILIES: dict[str, Family] = {
    "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "olmoe": "olmoe",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
    "gpt_oss": "gpt_oss",
}

MAX_ROPE_TABLE = 32768


def model_config_from_hf(c: dict[str, Any]) -> ModelConfig:
    """Map a Hugging Face config.json onto ModelConfig, refusing what the model cannot run."""
    model_type = c.get("model_type")
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise ValueError(
            f"unsupported model family {model_type!r}: moescope runs {sorted(FAMILIES)}"
        )
    sliding = c["use_sliding_window"] if "use_sliding_window" in c else c.get("sliding_window")
    refuse(
        bool(sliding) and family != "gpt_oss",
        f"sliding-window attention is not supported for {family} (only gpt_oss)",
    )
    refuse(
        c.get("decoder_sparse_step", 1) != 1 or bool(c.get("mlp_only_layers")),
        "checkpoints with dense (non-MoE) layers are not supported",
    )
    hidden, heads = int_field(c, "hidden_size"), int_field(c, "num_attention_heads")
    kv_heads = int_field(c, "num_key_value_heads", heads)
    refuse(
        heads % kv_heads != 0,
        f"config.json: num_attention_heads ({heads}) is not a "
        f"multiple of num_key_value_heads ({kv_heads})",
    )
    if family in ("deepseek_v2", "deepseek_v3"):
        return _deepseek(c, family)
    if family == "gpt_oss":
        return _gpt_oss(c)
    experts_key = first_set(c, "num_local_experts", "num_experts")
    num_experts, top_k = int_field(c, experts_key), int_field(c, "num_experts_per_tok")
    refuse(
        top_k > num_experts,
        f"config.json: num_experts_per_tok ({top_k}) exceeds {experts_key} ({num_experts})",
    )
    return ModelConfig(
        family=family,
        vocab_size=int_field(c, "vocab_size"),
        hidden_size=hidden,
        num_layers=int_field(c, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_head_dim(c, hidden, heads),
        moe_intermediate_size=int_field(
            c, first_set(c, "moe_intermediate_size", "intermediate_size")
        ),
        num_experts=num_experts,
        top_k=top_k,
        norm_topk_prob=family == "mixtral" or bool_field(c, "norm_topk_prob"),
        shared_expert_intermediate_size=int_field(
            c, "shared_expert_intermediate_size", 0, minimum=0
        )
        if family == "qwen2_moe"
        else 0,
        qkv_bias=_qkv_bias(family, c),
        o_proj_bias=family in ("olmoe", "qwen3_moe") and bool_field(c, "attention_bias"),
        qk_norm={"olmoe": "full", "qwen3_moe": "head"}.get(family, "none"),  # type: ignore[arg-type]
        clip_qkv=number_field(c, "clip_qkv", None),
        rms_eps=number_field(c, "rms_norm_eps", 1e-5),
        rope_theta=rope_theta(c, family),
        rope_scaling=rope_scaling(c),
        max_model_len=min(int_field(c, "max_position_embeddings", 4096), MAX_ROPE_TABLE),
        tie_embeddings=bool_field(c, "tie_word_embeddings"),
        eos_token_ids=_eos_token_ids(c),
    )


def _head_dim(c: dict[str, Any], hidden: int, heads: int) -> int:
    """`head_dim`, or hidden_size / num_attention_heads when the config does not give it."""
    head_dim = int_field(c, "head_dim", None)
    if head_dim is not None:
        return head_dim
    refuse(
        hidden % heads != 0,
        f"config.json: hidden_size ({hidden}) is not a multiple of "
        f"num_attention_heads ({heads}) and head_dim is not given",
    )
    return hidden // heads


def _deepseek(c: dict[str, Any], family: Family) -> ModelConfig:
    """DeepSeek-V2 / V3: MLA, group-limited routing, ungated shared experts, dense first
    layers (V3 always routes `noaux_tc`, as transformers does)."""
    hidden, heads, layers = (
        int_field(c, "hidden_size"),
        int_field(c, "num_attention_heads"),
        int_field(c, "num_hidden_layers"),
    )
    num_experts, top_k = int_field(c, "n_routed_experts"), int_field(c, "num_experts_per_tok")
    refuse(
        top_k > num_experts,
        f"config.json: num_experts_per_tok ({top_k}) exceeds n_routed_experts ({num_experts})",
    )
    refuse(
        int_field(c, "moe_layer_freq", 1) != 1,
        "config.json: 'moe_layer_freq' other than 1 is not supported",
    )
    method: TopkMethod = (
        "noaux_tc" if family == "deepseek_v3" else field(c, "topk_method", (str,), "greedy")
    )
    refuse(
        method not in ("greedy", "group_limited_greedy", "noaux_tc"),
        f"config.json: unsupported 'topk_method' {method!r}: moescope runs 'greedy', "
        "'group_limited_greedy' and 'noaux_tc'",
    )
    groups, topk_group = int_field(c, "n_group", 1), int_field(c, "topk_group", 1)
    if method != "greedy":
        refuse(
            num_experts % groups != 0,
            f"config.json: n_routed_experts ({num_experts}) is not a multiple of "
            f"n_group ({groups})",
        )
        refuse(
            topk_group > groups,
            f"config.json: topk_group ({topk_group}) exceeds n_group ({groups})",
        )
        refuse(
            method == "noaux_tc" and num_experts // groups < 2,
            f"config.json: noaux_tc scores a group by its best two experts, but n_group "
            f"({groups}) leaves {num_experts // groups} per group",
        )
        refuse(
            topk_group * (num_experts // groups) < top_k,
            f"config.json: topk_group ({topk_group}) groups of {num_experts // groups} experts "
            f"hold fewer than num_experts_per_tok ({top_k})",
        )
    dense = int_field(c, "first_k_dense_replace", 0, minimum=0)
    refuse(dense > layers, f"config.json: first_k_dense_replace ({dense}) exceeds the layers")
    moe_inter = int_field(c, "moe_intermediate_size")
    nope, rope = int_field(c, "qk_nope_head_dim"), int_field(c, "qk_rope_head_dim")
    refuse(rope % 2 != 0, f"config.json: qk_rope_head_dim ({rope}) must be even")
    return ModelConfig(
        family=family,
        vocab_size=int_field(c, "vocab_size"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,  # MLA expands its latent to every head
        head_dim=nope + rope,
        moe_intermediate_size=moe_inter,
        num_experts=num_experts,
        top_k=top_k,
        norm_topk_prob=bool_field(c, "norm_topk_prob"),
        shared_expert_intermediate_size=moe_inter * int_field(c, "n_shared_experts", 0, minimum=0),
        shared_expert_gated=False,
        qkv_bias=bool_field(c, "attention_bias"),
        rms_eps=number_field(c, "rms_norm_eps", 1e-6),
        rope_theta=rope_theta(c, family),
        rope_scaling=rope_scaling(c),
        max_model_len=min(int_field(c, "max_position_embeddings", 4096), MAX_ROPE_TABLE),
        tie_embeddings=bool_field(c, "tie_word_embeddings"),
        eos_token_ids=_eos_token_ids(c),
        kv_lora_rank=int_field(c, "kv_lora_rank"),
        q_lora_rank=int_field(c, "q_lora_rank", None),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=int_field(c, "v_head_dim"),
        rope_interleave=family == "deepseek_v2" or bool_field(c, "rope_interleave", True),
        topk_method=method,
        n_group=groups,
        topk_group=topk_group,
        routed_scaling_factor=number_field(c, "routed_scaling_factor", 1.0),
        first_k_dense_replace=dense,
        dense_intermediate_size=int_field(c, "intermediate_size") if dense else 0,
    )


LAYER_TYPES = ("sliding_attention", "full_attention")


def _gpt_oss(c: dict[str, Any]) -> ModelConfig:
    """gpt-oss: attention sinks, sliding and full layers (`layer_types`, alternating from a
    sliding first when absent, as transformers does), biases on q/k/v/o, the router and the
    experts, the clamped SwiGLU, softmax over the top-k router logits."""
    hidden, heads, layers = (
        int_field(c, "hidden_size"),
        int_field(c, "num_attention_heads"),
        int_field(c, "num_hidden_layers"),
    )
    num_experts, top_k = int_field(c, "num_local_experts"), int_field(c, "num_experts_per_tok")
    refuse(
        top_k > num_experts,
        f"config.json: num_experts_per_tok ({top_k}) exceeds num_local_experts ({num_experts})",
    )
    default_types = [LAYER_TYPES[i % 2] for i in range(layers)]
    types = field(c, "layer_types", (list,), default_types)
    refuse(
        len(types) != layers or any(t not in LAYER_TYPES for t in types),
        f"config.json: 'layer_types' must list {layers} of {list(LAYER_TYPES)}, got {types!r}",
    )
    window = int_field(c, "sliding_window", 0) if "sliding_attention" in types else 0
    refuse(
        "sliding_attention" in types and not window,
        "config.json: 'sliding_window' is required when a layer is 'sliding_attention'",
    )
    bias = bool_field(c, "attention_bias", True)
    return ModelConfig(
        family="gpt_oss",
        vocab_size=int_field(c, "vocab_size"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int_field(c, "num_key_value_heads", heads),
        head_dim=_head_dim(c, hidden, heads),
        moe_intermediate_size=int_field(c, "intermediate_size"),
        num_experts=num_experts,
        top_k=top_k,
        qkv_bias=bias,
        o_proj_bias=bias,
        rms_eps=number_field(c, "rms_norm_eps", 1e-5),
        rope_theta=rope_theta(c, "gpt_oss"),
        rope_scaling=rope_scaling(c),
        max_model_len=min(int_field(c, "max_position_embeddings", 4096), MAX_ROPE_TABLE),
        tie_embeddings=bool_field(c, "tie_word_embeddings"),
        eos_token_ids=_eos_token_ids(c),
        attention_sinks=True,
        sliding_window=window,
        layer_types=tuple(types),
        gate_bias=True,
        softmax_after_topk=True,
        expert_bias=True,
        swiglu_limit=number_field(c, "swiglu_limit", 7.0),
        swiglu_alpha=number_field(c, "swiglu_alpha", 1.702),
    )


def fp8_block(c: dict[str, Any]) -> tuple[int, int]:
    """The block of one FP8 scale (`quantization_config.weight_block_size`, 128 x 128)."""
    quant = field(c, "quantization_config", (dict,), {})
    method = quant.get("quant_method", "fp8")
    refuse(
        method not in ("fp8", "mxfp4"),
        f"config.json: unsupported 'quantization_config' quant_method {method!r}: "
        "moescope loads 'fp8' (block-scaled) and 'mxfp4' (gpt-oss experts) checkpoints",
    )
    block = quant.get("weight_block_size", [128, 128])
    ok = isinstance(block, list) and len(block) == 2 and all(type(b) is int for b in block)
    refuse(
        not ok or min(block) < 1,
        "config.json: 'quantization_config' weight_block_size must be two positive ints, "
        f"got {block!r}",
    )
    return block[0], block[1]


def _eos_token_ids(c: dict[str, Any]) -> tuple[int, ...]:
    eos = field(c, "eos_token_id", (int, list), [])
    ids = eos if isinstance(eos, list) else [eos]
    refuse(
        not all(isinstance(i, int) and not isinstance(i, bool) for i in ids),
        f"config.json: 'eos_token_id' must be an int or a list of ints, got {eos!r}",
    )
    return tuple(ids)


def _qkv_bias(family: Family, c: dict[str, Any]) -> bool:
    """Qwen2-MoE reads `qkv_bias` (default on); OLMoE and Qwen3-MoE read `attention_bias`."""
    if family == "qwen2_moe":
        return bool_field(c, "qkv_bias", True)
    return family != "mixtral" and bool_field(c, "attention_bias")
