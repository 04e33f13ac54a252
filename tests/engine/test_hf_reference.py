"""Our model against transformers' own implementations, on tiny random checkpoints.

Logits of every computed row (prefill, chunked prefill, decode, mixed in one flat batch) must
match transformers run on the whole sequence; greedy tokens must be its argmax. Also pins the
loader's refusals and the tokenizer.json round trip.
"""

import fcntl
import json
import os
import pty
import select
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from hf_checkpoints import (
    BOS,
    SPECS,
    build_tokenizer,
    make_checkpoint,
    rewrite_config,
    rewrite_tensors,
)
from parity import (
    GREEDY,
    cached_reference,
    check_chunked_prefill_and_prefix_hit,
    check_expert_parallel,
    check_prefill_and_decode,
    check_small_chunks,
    run,
)
from tokenizers import Tokenizer

from engine import LLM, LLMEngine, SamplingParams
from engine.model.hf_config import model_config_from_hf
from engine.model.tokenizer import FileTokenizer

FAMILIES = list(SPECS)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {name: make_checkpoint(root, name, seed=i) for i, name in enumerate(SPECS)}


@pytest.mark.parametrize("name", FAMILIES)
def test_prefill_and_decode_match_transformers(checkpoints: dict[str, Path], name: str) -> None:
    """Whole prompts in one step (7, 13 and 21 tokens, block size 16), then batched decodes."""
    path = checkpoints[name]
    rec = check_prefill_and_decode(path, cached_reference(path), [7, 13, 21], seed=len(name))
    assert [(c.start, c.num_tokens, c.is_prefill) for c in rec.steps[0]] == [
        (0, n, True) for n in (7, 13, 21)
    ]
    assert all(len(s) == 3 and not any(c.is_prefill for c in s) for s in rec.steps[1:])


@pytest.mark.parametrize("name", FAMILIES)
def test_chunked_mixed_batches_match_transformers(checkpoints: dict[str, Path], name: str) -> None:
    """Chunks of 5 over blocks of 4 under an 8-token budget, arrivals while others decode.

    The last request shares two full blocks with an earlier one and reads them from the
    prefix cache, so its attention runs over KV another request wrote.
    """
    path = checkpoints[name]
    rec = check_chunked_prefill_and_prefix_hit(
        path, cached_reference(path), [7, 11, 6, 3], seed=len(name)
    )
    chunks = [ch for step in rec.steps for ch in step]
    assert any(ch.is_prefill and ch.start % 4 for ch in chunks), "no chunk starts mid-block"
    assert max(len(step) for step in rec.steps) >= 3
    assert max(sum(ch.num_tokens for ch in step) for step in rec.steps) <= 8


def test_moe_loop_backend_matches_transformers(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", "loop")
    path = checkpoints["qwen2_moe"]
    check_small_chunks(path, cached_reference(path), [9, 2], seed=5)


# loading errors


def test_unsupported_family_is_refused(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "llama"
    shutil.copytree(checkpoints["mixtral"], path)
    rewrite_config(path, model_type="llama", architectures=["LlamaForCausalLM"])
    with pytest.raises(ValueError, match="unsupported model family 'llama'"):
        LLMEngine(model=str(path))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}),
            "unsupported rope scaling 'dynamic'",
        ),
        (dict(use_sliding_window=True, sliding_window=8), "sliding-window"),
        (dict(mlp_only_layers=[1]), "dense"),
        (dict(decoder_sparse_step=2), "dense"),
    ],
)
def test_unsupported_config_is_refused(
    checkpoints: dict[str, Path], changes: dict[str, object], message: str
) -> None:
    cfg = json.loads((checkpoints["qwen2_moe"] / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        model_config_from_hf({**cfg, **changes})


@pytest.mark.parametrize(
    ("name", "key", "named"),
    [
        ("mixtral", "model.layers.1.block_sparse_moe.experts.2.w3.weight", "layers.1.experts.2.up"),
        ("qwen3_moe", "model.layers.0.mlp.experts.7.down_proj.weight", "layers.0.experts.7.down"),
        (
            "qwen2_moe",
            "model.layers.1.mlp.shared_expert_gate.weight",
            "layers.1.mlp.shared_expert_gate.weight",
        ),
    ],
)
def test_missing_tensor_is_named(
    checkpoints: dict[str, Path], tmp_path: Path, name: str, key: str, named: str
) -> None:
    path = tmp_path / name
    shutil.copytree(checkpoints[name], path)
    rewrite_tensors(path, lambda tensors: tensors.pop(key))
    with pytest.raises(ValueError, match="missing tensors") as err:
        LLMEngine(model=str(path))
    assert named in str(err.value)


def test_unknown_preset_and_missing_path_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown synthetic preset 'huge'"):
        LLMEngine(model="synthetic:huge")
    with pytest.raises(ValueError, match="unknown model"):
        LLMEngine(model=str(tmp_path / "does-not-exist"))
    with pytest.raises(ValueError, match="unknown model"):
        LLMEngine(model=str(tmp_path))  # a directory, but no config.json


def test_checkpoint_without_tokenizer_takes_token_ids_only(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, "mixtral", tokenizer=False)
    engine = LLMEngine(model=str(path), num_kv_blocks=16, block_size=4)
    with pytest.raises(ValueError, match="no tokenizer.json: pass prompts as token ids"):
        engine.add_request("the cat sat", GREEDY)
    [out] = run(engine, [(0, [BOS, 5, 6, 7])], GREEDY).values()
    assert len(out.token_ids) == GREEDY.max_tokens
    assert out.text == ""


# text round trip


def test_text_prompt_round_trip(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["olmoe"]
    text = "the cat sat on the mat and saw a bird"
    direct = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = direct.encode(text).ids
    assert ids[0] == BOS and len(ids) == 11 and 2 not in ids  # <s> + words, none unknown
    assert FileTokenizer(path / "tokenizer.json").encode(text) == ids
    assert build_tokenizer().encode(text).ids == ids

    llm = LLM(model=str(path), num_kv_blocks=16, block_size=4)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    [out] = llm.generate([text], params, use_tqdm=False)
    assert out.prompt_token_ids == ids
    assert out.text == direct.decode(out.token_ids, skip_special_tokens=True)
    assert out.text.strip()
    assert FileTokenizer(path / "tokenizer.json").decode(ids) == text


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_expert_parallel_matches_transformers(checkpoints: dict[str, Path], name: str) -> None:
    """Experts sharded over 2 real ranks: log-probabilities of every generated position and
    the greedy tokens still follow transformers (shared experts included)."""
    path = checkpoints[name]
    check_expert_parallel(path, cached_reference(path), [7, 13, 21], len(name) + 1, steps=[0, 1, 3])


@pytest.mark.slow
def test_loading_shows_progress_on_a_terminal(checkpoints: dict[str, Path]) -> None:
    main, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    code = f"from engine import LLM; LLM({str(checkpoints['mixtral'])!r})"
    done = subprocess.run([sys.executable, "-c", code], stderr=follower, timeout=120)
    os.close(follower)
    text = b""
    while chunk := _read_ready(main):
        text += chunk
    os.close(main)
    assert done.returncode == 0
    assert b"loading weights" in text and b"100%" in text


def _read_ready(fd: int) -> bytes:
    """What the pseudo-terminal holds now (b"" once it is drained)."""
    try:
        return os.read(fd, 65536) if select.select([fd], [], [], 0.5)[0] else b""
    except OSError:  # the other end is closed
        return b""
