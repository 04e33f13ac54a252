"""Build a model from a synthetic preset or a local Hugging Face checkpoint directory."""

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from engine.config import Family, ModelConfig
from engine.model.tokenizer import ByteTokenizer, FileTokenizer, NoTokenizer, Tokenizer
from engine.model.transformer import MoETransformer

SYNTHETIC_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        moe_intermediate_size=96,
        num_experts=8,
        top_k=2,
        max_model_len=1024,
    ),
    "small": dict(
        hidden_size=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        head_dim=32,
        moe_intermediate_size=384,
        num_experts=16,
        top_k=2,
        max_model_len=2048,
        router_skew=0.6,
    ),
    "medium": dict(
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        moe_intermediate_size=768,
        num_experts=64,
        top_k=4,
        max_model_len=4096,
        router_skew=0.6,
    ),
}

FAMILIES: dict[str, Family] = {
    "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "olmoe": "olmoe",
}

MAX_ROPE_TABLE = 32768

# `demo` names the small MoE that models/train_demo.py trains on the standard library; it
# ships in the repository (models/demo/), next to the engine package
DEMO_MODEL = Path(__file__).resolve().parents[2] / "models" / "demo"


def resolve_model_path(name: str) -> Path:
    """The checkpoint directory that model `name` (`demo` or a path) stands for."""
    return DEMO_MODEL if name == "demo" else Path(name)


def load_model(
    name: str, dtype: torch.dtype, device: str, seed: int = 0, router_skew: float | None = None
) -> tuple[MoETransformer, Tokenizer]:
    """`synthetic:<preset>`, `demo` or a path to a Hugging Face checkpoint directory."""
    if name.startswith("synthetic:"):
        return _synthetic(name.removeprefix("synthetic:"), dtype, device, seed, router_skew)
    path = resolve_model_path(name)
    if not (path / "config.json").is_file():
        presets = ", ".join(f"synthetic:{p}" for p in SYNTHETIC_PRESETS)
        raise ValueError(
            f"unknown model {name!r}: expected one of {presets}, demo "
            "or a directory with config.json"
        )
    cfg = model_config_from_hf(_read_config(path))
    model = MoETransformer(cfg)
    load_safetensors(model, path)
    tok_path = path / "tokenizer.json"
    tokenizer = FileTokenizer(tok_path) if tok_path.is_file() else NoTokenizer(path)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def _synthetic(
    preset: str, dtype: torch.dtype, device: str, seed: int, router_skew: float | None
) -> tuple[MoETransformer, Tokenizer]:
    if preset not in SYNTHETIC_PRESETS:
        raise ValueError(
            f"unknown synthetic preset {preset!r}: expected one of {sorted(SYNTHETIC_PRESETS)}"
        )
    tok = ByteTokenizer()
    kw = dict(SYNTHETIC_PRESETS[preset])
    if router_skew is not None:
        kw["router_skew"] = router_skew
    cfg = ModelConfig(
        family="mixtral", vocab_size=tok.vocab_size, eos_token_ids=(tok.eos_token_id,), **kw
    )
    model = MoETransformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(
                    0.0,
                    1.0 / math.sqrt(p.shape[-2] if p.dim() == 3 else p.shape[-1]),
                    generator=gen,
                )
        skew = -cfg.router_skew * torch.log1p(torch.arange(cfg.num_experts, dtype=torch.float))
        for layer in model.decoder_layers:
            layer.mlp.router_bias.copy_(skew)
    return model.to(device=device, dtype=dtype).eval(), tok


def _refuse(cond: bool, message: str) -> None:
    if cond:
        raise ValueError(message)


def _read_config(path: Path) -> dict[str, Any]:
    """The JSON object in `path`/config.json."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{file} is not valid JSON: {e}") from e
    _refuse(
        not isinstance(config, dict),
        f"{file} must hold a JSON object, not a {type(config).__name__}",
    )
    return config


_REQUIRED: Any = object()


def _value(c: dict[str, Any], key: str, kinds: tuple[type, ...], default: Any = _REQUIRED) -> Any:
    """`c[key]` checked against `kinds` (a bool is no number); null or absent gives `default`."""
    value = c.get(key)
    if value is None:
        _refuse(default is _REQUIRED, f"config.json is missing the required key {key!r}")
        return default
    wrong = not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
    expected = " or ".join(k.__name__ for k in kinds)
    _refuse(wrong, f"config.json: {key!r} must be {expected}, got {value!r}")
    return value


def _int(c: dict[str, Any], key: str, default: Any = _REQUIRED, minimum: int = 1) -> Any:
    """An integer of at least `minimum` (or `default` when absent)."""
    value = _value(c, key, (int,), default)
    _refuse(
        c.get(key) is not None and value < minimum,
        f"config.json: {key!r} must be at least {minimum}, got {value!r}",
    )
    return value


def _number(c: dict[str, Any], key: str, default: Any = _REQUIRED) -> Any:
    """A positive finite number (or `default` when absent)."""
    value = _value(c, key, (int, float), default)
    _refuse(
        c.get(key) is not None and not 0 < value < math.inf,
        f"config.json: {key!r} must be a positive finite number, got {value!r}",
    )
    return value


def _first_set(c: dict[str, Any], *keys: str) -> str:
    """The first of `keys` that the config sets (not null), else the last."""
    return next((k for k in keys if c.get(k) is not None), keys[-1])


def model_config_from_hf(c: dict[str, Any]) -> ModelConfig:
    """Map a Hugging Face config.json onto ModelConfig, refusing what the model cannot run."""
    model_type = c.get("model_type")
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise ValueError(
            f"unsupported model family {model_type!r}: moescope runs {sorted(FAMILIES)}"
        )
    sliding = c["use_sliding_window"] if "use_sliding_window" in c else c.get("sliding_window")
    _refuse(bool(sliding), "sliding-window attention is not supported")
    _refuse(
        c.get("decoder_sparse_step", 1) != 1 or bool(c.get("mlp_only_layers")),
        "checkpoints with dense (non-MoE) layers are not supported",
    )
    hidden, heads = _int(c, "hidden_size"), _int(c, "num_attention_heads")
    kv_heads = _int(c, "num_key_value_heads", heads)
    _refuse(
        heads % kv_heads != 0,
        f"config.json: num_attention_heads ({heads}) is not a "
        f"multiple of num_key_value_heads ({kv_heads})",
    )
    experts_key = _first_set(c, "num_local_experts", "num_experts")
    num_experts, top_k = _int(c, experts_key), _int(c, "num_experts_per_tok")
    _refuse(
        top_k > num_experts,
        f"config.json: num_experts_per_tok ({top_k}) exceeds {experts_key} ({num_experts})",
    )
    return ModelConfig(
        family=family,
        vocab_size=_int(c, "vocab_size"),
        hidden_size=hidden,
        num_layers=_int(c, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_head_dim(c, hidden, heads),
        moe_intermediate_size=_int(c, _first_set(c, "moe_intermediate_size", "intermediate_size")),
        num_experts=num_experts,
        top_k=top_k,
        norm_topk_prob=family == "mixtral" or _flag(c, "norm_topk_prob"),
        shared_expert_intermediate_size=_int(c, "shared_expert_intermediate_size", 0, minimum=0)
        if family == "qwen2_moe"
        else 0,
        qkv_bias=_qkv_bias(family, c),
        o_proj_bias=family in ("olmoe", "qwen3_moe") and _flag(c, "attention_bias"),
        qk_norm={"olmoe": "full", "qwen3_moe": "head"}.get(family, "none"),  # type: ignore[arg-type]
        clip_qkv=_number(c, "clip_qkv", None),
        rms_eps=_number(c, "rms_norm_eps", 1e-5),
        rope_theta=_rope_theta(c, family),
        max_model_len=min(_int(c, "max_position_embeddings", 4096), MAX_ROPE_TABLE),
        tie_embeddings=_flag(c, "tie_word_embeddings"),
        eos_token_ids=_eos_token_ids(c),
    )


def _flag(c: dict[str, Any], key: str, default: bool = False) -> bool:
    return _value(c, key, (bool,), default)


def _head_dim(c: dict[str, Any], hidden: int, heads: int) -> int:
    """`head_dim`, or hidden_size / num_attention_heads when the config does not give it."""
    head_dim = _int(c, "head_dim", None)
    if head_dim is not None:
        return head_dim
    _refuse(
        hidden % heads != 0,
        f"config.json: hidden_size ({hidden}) is not a multiple of "
        f"num_attention_heads ({heads}) and head_dim is not given",
    )
    return hidden // heads


DEFAULT_ROPE_THETA: dict[Family, float] = {"mixtral": 1e6}


def _rope_theta(c: dict[str, Any], family: Family) -> float:
    """rope_theta as transformers reads it (`rope_scaling` over `rope_parameters` over the top
    level); rope scaling in either dict is refused."""
    ropes = {key: _value(c, key, (dict,), {}) for key in ("rope_scaling", "rope_parameters")}
    for key, rope in ropes.items():
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        _refuse(
            rope_type != "default", f"unsupported rope scaling {rope_type!r} (config.json {key!r})"
        )
    theta = _number(c, "rope_theta", DEFAULT_ROPE_THETA.get(family, 10000.0))
    return _number(ropes["rope_scaling"] or ropes["rope_parameters"], "rope_theta", theta)


def _eos_token_ids(c: dict[str, Any]) -> tuple[int, ...]:
    eos = _value(c, "eos_token_id", (int, list), [])
    ids = eos if isinstance(eos, list) else [eos]
    _refuse(
        not all(isinstance(i, int) and not isinstance(i, bool) for i in ids),
        f"config.json: 'eos_token_id' must be an int or a list of ints, got {eos!r}",
    )
    return tuple(ids)


def _qkv_bias(family: Family, c: dict[str, Any]) -> bool:
    """Qwen2-MoE reads `qkv_bias` (default on); OLMoE and Qwen3-MoE read `attention_bias`."""
    if family == "qwen2_moe":
        return _flag(c, "qkv_bias", True)
    return family != "mixtral" and _flag(c, "attention_bias")


EXPERT_KEY = re.compile(
    r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight"
)
EXPERT_ROLE = {
    "w1": "gate",
    "gate_proj": "gate",
    "w3": "up",
    "up_proj": "up",
    "w2": "down",
    "down_proj": "down",
}


def load_safetensors(model: MoETransformer, path: Path) -> None:
    """Copy every tensor of the checkpoint into the model; experts are stacked per layer.

    A progress bar (bytes read) shows on a terminal.
    """
    files = sorted(path.glob("*.safetensors"))
    _refuse(not files, f"{path} holds no *.safetensors weights")
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    sizes = {file: file.stat().st_size for file in files}
    with (
        torch.no_grad(),
        tqdm(
            total=sum(sizes.values()),
            desc="loading weights",
            unit="B",
            unit_scale=True,
            disable=None,
        ) as bar,
    ):
        for file in files:
            left = sizes[file]
            for key, tensor in _read_tensors(file):
                loaded.add(_load_tensor(model, params, file, key, tensor))
                bar.update(tensor.nbytes)
                left -= tensor.nbytes
            bar.update(left)  # the file's header
    expected = {n for n in params if ".w_" not in n}
    cfg = model.cfg
    expected |= {
        f"layers.{i}.experts.{e}.{r}"
        for i in range(cfg.num_layers)
        for e in range(cfg.num_experts)
        for r in ("gate", "up", "down")
    }
    if cfg.tie_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - loaded)
    _refuse(bool(missing), f"checkpoint {path} is missing tensors: {missing[:8]}")


def _read_tensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of one .safetensors file; a file that safetensors cannot read is named."""
    try:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                yield key, f.get_tensor(key)
    except SafetensorError as e:
        raise ValueError(f"cannot read {file}: {e}") from e


def _load_tensor(
    model: MoETransformer,
    params: dict[str, torch.nn.Parameter],
    file: Path,
    key: str,
    tensor: torch.Tensor,
) -> str:
    """Copy checkpoint tensor `key` of `file` into the model; returns the name it stands for."""
    where = f"tensor {key!r} in {file.name}"
    name = key.removeprefix("model.").replace("block_sparse_moe", "mlp")
    m = EXPERT_KEY.fullmatch(name)
    if m:
        cfg = model.cfg
        layer, expert, role = int(m[1]), int(m[2]), EXPERT_ROLE[m[3]]
        _refuse(
            layer >= cfg.num_layers or expert >= cfg.num_experts,
            f"unexpected {where}: config.json has {cfg.num_layers} layers of "
            f"{cfg.num_experts} experts",
        )
        _copy(_expert_weight(model, layer, expert, role), tensor, where)
        return f"layers.{layer}.experts.{expert}.{role}"
    if name == "lm_head.weight" and model.cfg.tie_embeddings:
        return name
    _refuse(name not in params, f"unexpected {where}")
    _copy(params[name], tensor, where)
    return name


def _copy(dst: torch.Tensor, src: torch.Tensor, where: str) -> None:
    """`dst.copy_(src)` once the shapes match exactly (copy_ would broadcast)."""
    _refuse(
        src.shape != dst.shape, f"{where} has shape {list(src.shape)}, expected {list(dst.shape)}"
    )
    _refuse(not src.is_floating_point(), f"{where} has dtype {src.dtype}, expected a float")
    dst.copy_(src)


def _expert_weight(model: MoETransformer, layer: int, expert: int, role: str) -> torch.Tensor:
    """The [out, in] view (as checkpoints store it) of one expert's projection."""
    mlp = model.decoder_layers[layer].mlp
    inter = model.cfg.moe_intermediate_size
    if role == "gate":
        return mlp.w_gate_up[expert, :, :inter].T
    if role == "up":
        return mlp.w_gate_up[expert, :, inter:].T
    return mlp.w_down[expert].T
