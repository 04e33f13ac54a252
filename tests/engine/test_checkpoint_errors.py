"""Malformed checkpoints are refused at load with a ValueError naming the file, field or tensor.

Each case damages a copy of one tiny Mixtral checkpoint (4 experts, 2 layers, hidden 32,
expert width 48, vocabulary 128) written with `save_pretrained`.
"""

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hf_checkpoints import DELETE, make_checkpoint, rewrite_config, rewrite_tensors
from transformers import AutoConfig

from engine import LLM
from engine.model.loader import load_model

Damage = Callable[[Path], None]


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"), "mixtral")


@pytest.fixture
def copy(mixtral: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(mixtral, tmp_path / "mixtral"))


def _refusal(path: Path) -> str:
    with pytest.raises(ValueError) as err:
        load_model(str(path), torch.float32, "cpu")
    return str(err.value)


def _set_tensor(key: str, tensor: torch.Tensor) -> Damage:
    return lambda path: rewrite_tensors(path, lambda tensors: tensors.update({key: tensor}))


def _set_config(**changes: object) -> Damage:
    return lambda path: rewrite_config(path, **changes)


def _write(name: str, data: bytes) -> Damage:
    return lambda path: (path / name).write_bytes(data)


def _truncate(path: Path) -> None:
    file = path / "model.safetensors"
    file.write_bytes(file.read_bytes()[:1000])


SHAPES: list[tuple[str, torch.Tensor, str, str]] = [
    ("model.embed_tokens.weight", torch.zeros(1, 32), "[128, 32]", "[1, 32]"),
    ("model.layers.0.input_layernorm.weight", torch.tensor(1.0), "[32]", "[]"),
    (
        "model.layers.0.block_sparse_moe.experts.0.w1.weight",
        torch.zeros(1, 32),
        "[48, 32]",
        "[1, 32]",
    ),
    (
        "model.layers.1.block_sparse_moe.experts.3.w2.weight",
        torch.zeros(48, 32),
        "[32, 48]",
        "[48, 32]",
    ),
    ("model.layers.1.self_attn.q_proj.weight", torch.zeros(5, 7), "[32, 32]", "[5, 7]"),
]


@pytest.mark.parametrize(("key", "tensor", "expected", "found"), SHAPES)
def test_wrong_shape_is_refused(
    copy: Path, key: str, tensor: torch.Tensor, expected: str, found: str
) -> None:
    """Even shapes that broadcast: copy_ would have loaded them silently."""
    _set_tensor(key, tensor)(copy)
    with pytest.raises(ValueError) as err:
        LLM(model=str(copy), num_kv_blocks=16)
    assert str(err.value) == (
        f"tensor {key!r} in model.safetensors has shape {found}, expected {expected}"
    )


MALFORMED: dict[str, tuple[Damage, list[str]]] = {
    # tensors
    "expert index": (
        _set_tensor("model.layers.0.block_sparse_moe.experts.4.w1.weight", torch.zeros(48, 32)),
        ["unexpected tensor", "experts.4.w1", "model.safetensors", "4 experts"],
    ),
    "layer index of an expert": (
        _set_tensor("model.layers.2.block_sparse_moe.experts.0.w3.weight", torch.zeros(48, 32)),
        ["unexpected tensor", "layers.2.block_sparse_moe", "2 layers"],
    ),
    "layer index": (
        _set_tensor("model.layers.2.input_layernorm.weight", torch.ones(32)),
        ["unexpected tensor", "layers.2.input_layernorm"],
    ),
    "integer dtype": (
        _set_tensor("model.norm.weight", torch.ones(32, dtype=torch.int64)),
        ["'model.norm.weight'", "torch.int64"],
    ),
    # files
    "invalid json": (
        _write("config.json", b'{"model_type": "mixtral",'),
        ["config.json", "not valid JSON"],
    ),
    "json list": (_write("config.json", b"[1, 2]"), ["config.json", "JSON object", "list"]),
    "not utf-8": (_write("config.json", b"\xff\xfe"), ["config.json", "not valid JSON"]),
    "empty safetensors": (_write("model.safetensors", b""), ["model.safetensors", "cannot read"]),
    "truncated safetensors": (_truncate, ["model.safetensors", "cannot read"]),
    "empty tokenizer": (
        _write("tokenizer.json", b"{}"),
        ["tokenizer.json", "cannot read", "Model missing"],
    ),
    # config fields
    "missing heads": (
        _set_config(num_attention_heads=DELETE),
        ["config.json", "'num_attention_heads'"],
    ),
    "missing experts": (_set_config(num_local_experts=DELETE), ["config.json", "'num_experts'"]),
    "zero layers": (
        _set_config(num_hidden_layers=0),
        ["'num_hidden_layers'", "at least 1", "got 0"],
    ),
    "negative hidden": (_set_config(hidden_size=-32), ["'hidden_size'", "at least 1"]),
    "zero expert width": (_set_config(intermediate_size=0), ["'intermediate_size'", "at least 1"]),
    "zero experts": (_set_config(num_local_experts=0), ["'num_local_experts'", "at least 1"]),
    "string vocab": (
        _set_config(vocab_size="128"),
        ["config.json", "'vocab_size'", "must be int", "'128'"],
    ),
    "bool vocab": (_set_config(vocab_size=True), ["'vocab_size'", "must be int"]),
    "float layers": (_set_config(num_hidden_layers=2.0), ["'num_hidden_layers'", "must be int"]),
    "string eps": (_set_config(rms_norm_eps="1e-5"), ["'rms_norm_eps'", "must be int or float"]),
    "zero eps": (_set_config(rms_norm_eps=0), ["'rms_norm_eps'", "positive"]),
    "string flag": (
        _set_config(tie_word_embeddings="false"),
        ["'tie_word_embeddings'", "must be bool"],
    ),
    "string eos": (_set_config(eos_token_id=["1"]), ["'eos_token_id'", "list of ints"]),
    "string rope": (_set_config(rope_parameters="default"), ["'rope_parameters'", "must be dict"]),
    "string theta": (
        _set_config(rope_parameters={"rope_type": "default", "rope_theta": "1e6"}),
        ["'rope_theta'", "must be int or float"],
    ),
    "heads not dividing hidden": (
        _set_config(num_attention_heads=6, num_key_value_heads=2),
        ["hidden_size (32)", "num_attention_heads (6)", "head_dim is not given"],
    ),
    "kv heads not dividing heads": (
        _set_config(num_key_value_heads=3),
        ["num_attention_heads (4)", "num_key_value_heads (3)"],
    ),
    "top k over experts": (
        _set_config(num_experts_per_tok=5),
        ["config.json", "num_experts_per_tok (5)", "num_local_experts (4)"],
    ),
    "rope_scaling beside rope_parameters": (
        _set_config(rope_scaling={"rope_type": "longrope", "factor": 4.0}),
        ["unsupported rope scaling 'longrope'", "'rope_scaling'"],
    ),
    "legacy rope_scaling": (
        _set_config(rope_scaling={"type": "dynamic", "factor": 2.0}, rope_parameters=DELETE),
        ["'dynamic'", "'rope_scaling'"],
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_checkpoint_is_named(copy: Path, case: str) -> None:
    damage, named = MALFORMED[case]
    damage(copy)
    message = _refusal(copy)
    assert all(part in message for part in named), message


@pytest.mark.parametrize(
    "changes",
    [
        dict(rope_parameters=DELETE),
        dict(rope_parameters=DELETE, rope_theta=555.0),
        dict(rope_scaling={"rope_type": "default"}),
        dict(rope_scaling={"type": "default"}, rope_theta=555.0),
        dict(rope_scaling={"rope_type": "default", "rope_theta": 123.0}),
    ],
)
def test_rope_theta_follows_transformers(copy: Path, changes: dict[str, object]) -> None:
    """`rope_scaling` wins over `rope_parameters`; Mixtral's own default theta is 1e6."""
    _set_config(**changes)(copy)
    model, _ = load_model(str(copy), torch.float32, "cpu")
    expected = AutoConfig.from_pretrained(copy).rope_parameters["rope_theta"]
    assert model.cfg.rope_theta == expected
