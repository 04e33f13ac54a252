"""A checkpoint's safetensors copied into the model: Hugging Face names mapped onto ours,
experts stacked per layer, FP8 and MXFP4 weights dequantized, missing tensors refused."""

import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from engine.model.fp8 import Dequantizer
from engine.model.hf_fields import refuse
from engine.model.moe import MoEBlock
from engine.model.mxfp4 import Mxfp4Dequantizer
from engine.model.transformer import MoETransformer

EXPERT_KEY = re.compile(
    r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight"
)
# DeepSeek's names for what the MoE block holds under other names
RENAMES = (
    (".mlp.shared_experts.", ".mlp.shared_expert."),
    (".mlp.gate.e_score_correction_bias", ".mlp.e_score_correction_bias"),
    (".mlp.router.", ".mlp.gate."),  # gpt-oss
)
# gpt-oss stores each layer's experts stacked, gate and up interleaved column by column
STACKED_KEY = re.compile(r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?")
LAYER_KEY = re.compile(r"layers\.(\d+)\.")
SKIPPED = ""  # what _load_tensor names a tensor it ignores
EXPERT_ROLE = {
    "w1": "gate",
    "gate_proj": "gate",
    "w3": "up",
    "up_proj": "up",
    "w2": "down",
    "down_proj": "down",
}


def load_safetensors(
    model: MoETransformer, path: Path, fp8_block: tuple[int, int] = (128, 128)
) -> None:
    """Copy every tensor of the checkpoint into the model; experts are stacked per layer and
    FP8 weights dequantized with their block scales.

    A progress bar (bytes read) shows on a terminal.
    """
    fp8, mxfp4 = Dequantizer(fp8_block), Mxfp4Dequantizer()
    files = sorted(path.glob("*.safetensors"))
    refuse(not files, f"{path} holds no *.safetensors weights")
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
            for raw_key, raw in _read_tensors(file):
                for fp8_key, fp8_tensor in fp8.feed(raw_key, raw):
                    for key, tensor in mxfp4.feed(fp8_key, fp8_tensor):
                        loaded.add(_load_tensor(model, params, file, key, tensor))
                bar.update(raw.nbytes)
                left -= raw.nbytes
            bar.update(left)  # the file's header
    unpaired = fp8.unpaired()
    refuse(bool(unpaired), f"checkpoint {path} has FP8 tensors without a pair: {unpaired[:8]}")
    unpaired = mxfp4.unpaired()
    refuse(bool(unpaired), f"checkpoint {path} has MXFP4 tensors without a pair: {unpaired[:8]}")
    loaded.discard(SKIPPED)
    expected = {n for n in params if ".w_" not in n}
    cfg = model.cfg
    expected |= {
        f"layers.{i}.experts.{e}.{r}"
        for i in cfg.moe_layers
        for e in range(cfg.num_experts)
        for r in ("gate", "up", "down")
    }
    if cfg.family == "gpt_oss":  # its experts come stacked, as the model holds them
        expected = set(params)
    if cfg.tie_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - loaded)
    refuse(bool(missing), f"checkpoint {path} is missing tensors: {missing[:8]}")


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
    for old, new in RENAMES:
        name = name.replace(old, new)
    layer_key = LAYER_KEY.match(name)
    if layer_key and int(layer_key[1]) >= model.cfg.num_layers and model.cfg.kv_lora_rank:
        return SKIPPED  # DeepSeek's multi-token-prediction layers, which decoding does not use
    stacked = STACKED_KEY.fullmatch(name)
    if stacked:
        return _load_stacked(model, int(stacked[1]), stacked[2], bool(stacked[3]), tensor, where)
    m = EXPERT_KEY.fullmatch(name)
    if m:
        cfg = model.cfg
        layer, expert, role = int(m[1]), int(m[2]), EXPERT_ROLE[m[3]]
        refuse(
            layer >= cfg.num_layers or expert >= cfg.num_experts,
            f"unexpected {where}: config.json has {cfg.num_layers} layers of "
            f"{cfg.num_experts} experts",
        )
        _copy(_expert_weight(model, layer, expert, role), tensor, where)
        return f"layers.{layer}.experts.{expert}.{role}"
    if name == "lm_head.weight" and model.cfg.tie_embeddings:
        return name
    refuse(name not in params, f"unexpected {where}")
    _copy(params[name], tensor, where)
    return name


def _copy(dst: torch.Tensor, src: torch.Tensor, where: str) -> None:
    """`dst.copy_(src)` once the shapes match exactly (copy_ would broadcast)."""
    refuse(
        src.shape != dst.shape, f"{where} has shape {list(src.shape)}, expected {list(dst.shape)}"
    )
    refuse(not src.is_floating_point(), f"{where} has dtype {src.dtype}, expected a float")
    dst.copy_(src)


def _load_stacked(
    model: MoETransformer, layer: int, proj: str, bias: bool, tensor: torch.Tensor, where: str
) -> str:
    """Copy one of gpt-oss's stacked expert tensors (gate_up_proj [E, H, 2I], down_proj
    [E, I, H], their biases [E, 2I] and [E, H]); gate and up columns alternate in gate_up,
    and the model holds all gate columns, then all up ones."""
    cfg = model.cfg
    refuse(layer >= cfg.num_layers, f"unexpected {where}: config.json has {cfg.num_layers} layers")
    mlp = model.decoder_layers[layer].mlp
    assert isinstance(mlp, MoEBlock)
    attr = ("b_" if bias else "w_") + ("gate_up" if proj == "gate_up_proj" else "down")
    dst = getattr(mlp, attr)
    refuse(dst is None, f"unexpected {where}: the model has no expert biases")
    if proj == "gate_up_proj" and tensor.shape[-1] % 2 == 0:
        tensor = torch.cat([tensor[..., 0::2], tensor[..., 1::2]], dim=-1)
    _copy(dst, tensor, where)
    return f"layers.{layer}.mlp.{attr}"


def _expert_weight(model: MoETransformer, layer: int, expert: int, role: str) -> torch.Tensor:
    """The [out, in] view (as checkpoints store it) of one expert's projection."""
    mlp = model.decoder_layers[layer].mlp
    refuse(not isinstance(mlp, MoEBlock), f"layer {layer} is dense and has no experts")
    assert isinstance(mlp, MoEBlock)
    inter = model.cfg.moe_intermediate_size
    if role == "gate":
        return mlp.w_gate_up[expert, :, :inter].T
    if role == "up":
        return mlp.w_gate_up[expert, :, inter:].T
    return mlp.w_down[expert].T
