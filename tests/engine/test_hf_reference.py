"""Our model against transformers' own implementations, on tiny random checkpoints.

Logits of every computed row (prefill, chunked prefill, decode, mixed in one flat batch) must
match transformers run on the whole sequence; greedy tokens must be its argmax. Also pins the
loader's refusals and the tokenizer.json round trip.
"""

import dataclasses
import fcntl
import json
import os
import pty
import random
import select
import shutil
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
import torch
from hf_checkpoints import (
    BOS,
    SPECS,
    build_tokenizer,
    load_reference,
    make_checkpoint,
    reference_logits,
    rewrite_config,
    rewrite_tensors,
)
from tokenizers import Tokenizer
from transformers import PreTrainedModel

from engine import LLM, LLMEngine, RequestOutput, SamplingParams
from engine.model.hf_config import model_config_from_hf
from engine.model.tokenizer import FileTokenizer
from engine.scheduler import SchedulerOutput
from engine.step_records import ForwardResult, ModelInput

ATOL = 1e-4
FAMILIES = list(SPECS)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {name: make_checkpoint(root, name, seed=i) for i, name in enumerate(SPECS)}


@cache
def _reference(path: Path) -> PreTrainedModel:
    return load_reference(path)


@dataclasses.dataclass(frozen=True)
class Chunk:
    req: str
    start: int
    num_tokens: int
    is_prefill: bool


class LogitRecorder:
    """Wraps an engine's scheduler and runner to keep the logits of every row of every step.

    The wrapper reruns the model on the step's input (rewriting the same KV is idempotent),
    projects all rows to logits, then lets the engine's own forward run unchanged.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.rows: dict[str, dict[int, torch.Tensor]] = {}
        self.steps: list[list[Chunk]] = []
        self._sched: SchedulerOutput | None = None
        schedule, forward = engine.scheduler.schedule, engine.runner.forward
        engine.scheduler.schedule = self._wrap_schedule(schedule)  # type: ignore[method-assign]
        engine.runner.forward = self._wrap_forward(forward)  # type: ignore[method-assign]

    def _wrap_schedule(self, schedule: Callable[[], SchedulerOutput]) -> Callable:
        def recording_schedule() -> SchedulerOutput:
            self._sched = schedule()
            return self._sched

        return recording_schedule

    def _wrap_forward(self, forward: Callable[[ModelInput], ForwardResult]) -> Callable:
        def recording_forward(inp: ModelInput) -> ForwardResult:
            logits = self._all_logits(inp)
            result = forward(inp)
            torch.testing.assert_close(result.logits, logits[inp.sample_rows], atol=1e-5, rtol=0)
            return result

        return recording_forward

    @torch.inference_mode()
    def _all_logits(self, inp: ModelInput) -> torch.Tensor:
        model = self.engine.model
        ctx = dataclasses.replace(inp.ctx, expert_counts=[], expert_dropped=[])
        logits = model.compute_logits(model(inp.input_ids, inp.positions, ctx))
        assert self._sched is not None
        chunks = [
            Chunk(c.req.request_id, c.start, c.num_tokens, c.is_prefill) for c in self._sched.chunks
        ]
        row = 0
        for c in chunks:
            per_pos = self.rows.setdefault(c.req, {})
            for i in range(c.num_tokens):
                per_pos[c.start + i] = logits[row + i].clone()
            row += c.num_tokens
        assert row == logits.shape[0]
        self.steps.append(chunks)
        return logits


def _engine(path: Path, **kwargs: int | bool) -> tuple[LLMEngine, LogitRecorder]:
    engine = LLMEngine(model=str(path), num_kv_blocks=64, **kwargs)
    return engine, LogitRecorder(engine)


def _run(
    engine: LLMEngine, arrivals: list[tuple[int, list[int]]], params: SamplingParams
) -> dict[str, RequestOutput]:
    """Add each prompt at its step index, step until everything finished."""
    pending = sorted(arrivals, key=lambda a: a[0])
    rids: list[str] = []
    done: dict[str, RequestOutput] = {}
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            rids.append(engine.add_request(pending.pop(0)[1], params))
        for out in engine.step().outputs:
            if out.finished:
                done[out.request_id] = out
        step += 1
    assert sorted(done) == sorted(rids)
    return {rid: done[rid] for rid in rids}


def _assert_matches_reference(
    ref: PreTrainedModel, rec: LogitRecorder, outputs: dict[str, RequestOutput], block: int
) -> None:
    for rid, out in outputs.items():
        seq = out.prompt_token_ids + out.token_ids
        fed = len(seq) - 1  # the last generated token is never fed back
        positions = sorted(rec.rows[rid])
        first = positions[0]
        assert first % block == 0, f"{rid}: first computed position {first}"
        assert positions == list(range(first, fed)), f"{rid}: computed positions {positions}"
        expected = reference_logits(ref, seq[:fed])
        ours = torch.stack([rec.rows[rid][p] for p in positions])
        err = (ours - expected[first:]).abs().max().item()
        assert err < ATOL, f"{rid}: max |logit error| {err:.2e} over positions {first}..{fed}"
        prompt_len = len(out.prompt_token_ids)
        assert out.token_ids == expected[prompt_len - 1 :].argmax(-1).tolist(), rid


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 128) for _ in range(n)] for n in lengths]


GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("name", FAMILIES)
def test_prefill_and_decode_match_transformers(checkpoints: dict[str, Path], name: str) -> None:
    """Whole prompts in one step (7, 13 and 21 tokens, block size 16), then batched decodes."""
    engine, rec = _engine(
        checkpoints[name], block_size=16, prefill_chunk_size=0, max_num_batched_tokens=256
    )
    prompts = _prompts([7, 13, 21], seed=len(name))
    outputs = _run(engine, [(0, p) for p in prompts], GREEDY)
    first = rec.steps[0]
    assert [(c.start, c.num_tokens, c.is_prefill) for c in first] == [
        (0, len(p), True) for p in prompts
    ]
    assert all(len(s) == 3 and not any(c.is_prefill for c in s) for s in rec.steps[1:])
    _assert_matches_reference(_reference(checkpoints[name]), rec, outputs, block=16)


@pytest.mark.parametrize("name", FAMILIES)
def test_chunked_mixed_batches_match_transformers(checkpoints: dict[str, Path], name: str) -> None:
    """Chunks of 5 over blocks of 4 under an 8-token budget, arrivals while others decode.

    The last request shares two full blocks with an earlier one and reads them from the
    prefix cache, so its attention runs over KV another request wrote.
    """
    engine, rec = _engine(
        checkpoints[name],
        block_size=4,
        prefill_chunk_size=5,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        enable_prefix_caching=True,
    )
    a, b, c, d = _prompts([7, 11, 6, 3], seed=len(name))
    shared = b[:8] + _prompts([5], seed=99)[0]  # two full blocks in common with b
    arrivals = [(0, a), (2, b), (3, c), (3, d), (9, shared)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = _run(engine, arrivals, params)
    assert min(rec.rows[list(outputs)[-1]]) == 8, "the shared prefix was recomputed"
    chunks = [ch for step in rec.steps for ch in step]
    assert any(ch.is_prefill and ch.start % 4 for ch in chunks), "no chunk starts mid-block"
    assert any(len({ch.is_prefill for ch in step}) == 2 for step in rec.steps), "no mixed step"
    assert max(len(step) for step in rec.steps) >= 3
    assert max(sum(ch.num_tokens for ch in step) for step in rec.steps) <= 8
    _assert_matches_reference(_reference(checkpoints[name]), rec, outputs, block=4)


def test_moe_loop_backend_matches_transformers(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOESCOPE_MOE_BACKEND", "loop")
    engine, rec = _engine(
        checkpoints["qwen2_moe"],
        block_size=4,
        prefill_chunk_size=5,
        max_num_batched_tokens=8,
        max_num_seqs=4,
    )
    outputs = _run(engine, [(0, p) for p in _prompts([9, 2], seed=5)], GREEDY)
    _assert_matches_reference(_reference(checkpoints["qwen2_moe"]), rec, outputs, block=4)


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
    [out] = _run(engine, [(0, [BOS, 5, 6, 7])], GREEDY).values()
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
    engine = LLMEngine(
        model=str(checkpoints[name]),
        num_kv_blocks=64,
        block_size=4,
        prefill_chunk_size=8,
        max_num_batched_tokens=24,
        max_num_seqs=8,
        ep_size=2,
        ep_distributed=True,
    )
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=3)
    try:
        prompts = _prompts([7, 13, 21], seed=len(name) + 1)
        outputs = _run(engine, [(0, prompts[0]), (1, prompts[1]), (3, prompts[2])], params)
    finally:
        engine.close()
    ref = _reference(checkpoints[name])
    for out in outputs.values():
        seq = out.prompt_token_ids + out.token_ids
        expected = torch.log_softmax(reference_logits(ref, seq[:-1]), dim=-1)
        start = len(out.prompt_token_ids) - 1
        assert out.token_ids == expected[start:].argmax(-1).tolist()
        for i, top in enumerate(out.logprobs):
            for token, value in top.items():
                assert value == pytest.approx(expected[start + i, token].item(), abs=ATOL)


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
