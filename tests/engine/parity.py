"""The parity harness the model-family tests share: run our engine on a checkpoint, keep the
logits of every row it computed, and compare them (and the greedy tokens) with transformers
run on the whole sequence.

A plain module rather than a test module, so that test files import it and not each other.
The `check_*` helpers are the test shapes every family repeats (the checkpoint and a few
sizes differ); each returns what the caller needs for its family's own assertions.
"""

import dataclasses
import random
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_checkpoints import load_reference, reference_logits
from transformers import PreTrainedModel

from engine import LLMEngine, RequestOutput, SamplingParams
from engine.outputs import StepResult
from engine.scheduler import SchedulerOutput
from engine.step_records import ForwardResult, ModelInput

ATOL = 1e-4
GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


@cache
def cached_reference(path: Path) -> PreTrainedModel:
    """transformers on the checkpoint at `path`, loaded once per test session."""
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


def recorded_engine(path: Path, **kwargs: Any) -> tuple[LLMEngine, LogitRecorder]:
    """An engine on the checkpoint (64 KV blocks unless `kwargs` says otherwise), recorded."""
    engine = LLMEngine(model=str(path), **{"num_kv_blocks": 64, **kwargs})
    return engine, LogitRecorder(engine)


def chunked_engine(
    path: Path, chunk: int = 5, budget: int = 8, seqs: int = 4, **kwargs: Any
) -> tuple[LLMEngine, LogitRecorder]:
    """A recorded engine on blocks of 4 that prefills in chunks of `chunk` tokens, at most
    `budget` tokens and `seqs` requests a step."""
    return recorded_engine(
        path,
        block_size=4,
        prefill_chunk_size=chunk,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        **kwargs,
    )


def run(
    engine: LLMEngine,
    arrivals: list[tuple[int, list[int]]],
    params: SamplingParams,
    on_step: Callable[[StepResult], None] | None = None,
) -> dict[str, RequestOutput]:
    """Add each prompt at its step index, step until everything finished; `on_step` sees
    every step's result."""
    pending = sorted(arrivals, key=lambda a: a[0])
    rids: list[str] = []
    done: dict[str, RequestOutput] = {}
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            rids.append(engine.add_request(pending.pop(0)[1], params))
        result = engine.step()
        if on_step is not None:
            on_step(result)
        for out in result.outputs:
            if out.finished:
                done[out.request_id] = out
        step += 1
    assert sorted(done) == sorted(rids)
    return {rid: done[rid] for rid in rids}


def prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 128) for _ in range(n)] for n in lengths]


def assert_matches_reference(
    ref: PreTrainedModel, rec: LogitRecorder, outputs: dict[str, RequestOutput], block: int
) -> None:
    """Every request's computed rows are one run of positions from a block boundary (a prefix
    hit skips whole blocks) to its last fed token, their logits are transformers' within
    ATOL, and its tokens are transformers' argmax."""
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


def assert_logprobs_match_reference(
    ref: PreTrainedModel, outputs: dict[str, RequestOutput]
) -> None:
    """Greedy tokens are transformers' argmax and every returned log-probability is its
    log-softmax within ATOL (for engines whose rows a LogitRecorder cannot see)."""
    for out in outputs.values():
        seq = out.prompt_token_ids + out.token_ids
        expected = torch.log_softmax(reference_logits(ref, seq[:-1]), dim=-1)
        start = len(out.prompt_token_ids) - 1
        assert out.token_ids == expected[start:].argmax(-1).tolist()
        assert out.logprobs is not None
        for i, top in enumerate(out.logprobs):
            for token, value in top.items():
                assert value == pytest.approx(expected[start + i, token].item(), abs=ATOL)


# the test shapes every family runs


def check_prefill_and_decode(
    path: Path, ref: PreTrainedModel, lengths: list[int], seed: int, block: int = 16
) -> LogitRecorder:
    """Whole prompts in one step (no chunking, a 256-token budget), then greedy decodes."""
    engine, rec = recorded_engine(
        path, block_size=block, prefill_chunk_size=0, max_num_batched_tokens=256
    )
    outputs = run(engine, [(0, p) for p in prompts(lengths, seed)], GREEDY)
    assert_matches_reference(ref, rec, outputs, block=block)
    return rec


def check_chunked_prefill_and_prefix_hit(
    path: Path, ref: PreTrainedModel, lengths: list[int], seed: int
) -> LogitRecorder:
    """Chunks of 5 over blocks of 4 under an 8-token budget; the first prompt arrives at step
    0, the second at step 2, the rest at step 3, while others decode. A last request, at step
    9, shares two full blocks with the second and must read them from the prefix cache, so
    its attention runs over KV another request wrote; some step mixes prefill and decode."""
    engine, rec = chunked_engine(path, enable_prefix_caching=True)
    first, second, *rest = prompts(lengths, seed)
    shared = second[:8] + prompts([5], seed=99)[0]
    arrivals = [(0, first), (2, second), *[(3, p) for p in rest], (9, shared)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = run(engine, arrivals, params)
    assert min(rec.rows[list(outputs)[-1]]) == 8, "the shared prefix was recomputed"
    assert any(len({ch.is_prefill for ch in step}) == 2 for step in rec.steps), "no mixed step"
    assert_matches_reference(ref, rec, outputs, block=4)
    return rec


def check_preemption(
    path: Path, ref: PreTrainedModel, lengths: list[int], seed: int, **engine_args: Any
) -> tuple[dict[str, RequestOutput], int]:
    """Prompts all at step 0, 8 greedy tokens each, on blocks of 4 and an engine that
    `engine_args` makes too small for them all: returns the outputs and the preemptions the
    steps' telemetry counted, for the caller to require some."""
    engine, rec = recorded_engine(path, block_size=4, **engine_args)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    preempted = 0

    def count(result: StepResult) -> None:
        nonlocal preempted
        preempted += result.telemetry.queue.preempted

    outputs = run(engine, [(0, p) for p in prompts(lengths, seed)], params, on_step=count)
    assert_matches_reference(ref, rec, outputs, block=4)
    return outputs, preempted


def check_expert_parallel(
    path: Path, ref: PreTrainedModel, lengths: list[int], seed: int, steps: list[int]
) -> None:
    """Experts sharded over 2 real ranks, prompt i arriving at step `steps[i]`, in chunks of 8
    over blocks of 4: the greedy tokens and their top-3 log-probabilities follow transformers
    (log-probabilities, because a LogitRecorder cannot see the ranks' rows)."""
    engine = LLMEngine(
        model=str(path),
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
        outputs = run(engine, list(zip(steps, prompts(lengths, seed), strict=True)), params)
    finally:
        engine.close()
    assert_logprobs_match_reference(ref, outputs)


def check_small_chunks(path: Path, ref: PreTrainedModel, lengths: list[int], seed: int) -> None:
    """Prompts all at step 0 in chunks of 5 over blocks of 4 under an 8-token budget, greedy."""
    engine, rec = chunked_engine(path)
    outputs = run(engine, [(0, p) for p in prompts(lengths, seed)], GREEDY)
    assert_matches_reference(ref, rec, outputs, block=4)
