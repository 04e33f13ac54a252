"""The runs of the offline throughput benchmark: its model and workload, and one runner per
engine (ours continuous or static, `transformers` static `generate` and its continuous
batching). Each runner returns a `RunResult`; offline_throughput.py times and reports them.
Last, the engine's steps timed one by one (`timed_steps`, `ours_decode_ms`), for
`peer/decode_steps.py` and `gil.py`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from engine import LLMEngine, SamplingParams
from engine.telemetry import Durations, StepTelemetry
from stats import tpot

PAD_ID = 0
STAGES = tuple(Durations.model_fields)  # every stage a step record times


def progress(message: str) -> None:
    print(message, flush=True)


@contextlib.contextmanager
def moe_backend(name: str | None) -> Iterator[None]:
    """MOESCOPE_MOE_BACKEND=name for the duration (None: the default), then as it was."""
    old = os.environ.pop("MOESCOPE_MOE_BACKEND", None)
    if name is not None:
        os.environ["MOESCOPE_MOE_BACKEND"] = name
    try:
        yield
    finally:
        os.environ.pop("MOESCOPE_MOE_BACKEND", None)
        if old is not None:
            os.environ["MOESCOPE_MOE_BACKEND"] = old


# ---------------------------------------------------------------- model and workload


@dataclass(frozen=True)
class Shape:
    """A Mixtral-shaped checkpoint (fp32, random weights)."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    experts: int
    top_k: int
    max_positions: int

    def describe(self) -> str:
        return (
            f"Mixtral-shaped, hidden {self.hidden}, {self.layers} layers, {self.experts} "
            f"experts top-{self.top_k}, intermediate {self.intermediate}, {self.heads} heads / "
            f"{self.kv_heads} kv heads, vocab {self.vocab}, fp32, random weights"
        )


FULL_SHAPE = Shape(
    vocab=8192,
    hidden=512,
    intermediate=1024,
    layers=4,
    heads=8,
    kv_heads=4,
    experts=8,
    top_k=2,
    max_positions=1024,
)
# issue 17's model, the one every CPU speed comparison uses (forward, threads, the peer):
# the offline shape with a 4096-token vocabulary, 2 KV heads and room for long contexts
SERVE_SHAPE = replace(FULL_SHAPE, vocab=4096, kv_heads=2, max_positions=4096)
# fine-grained experts: many small ones, more of them per token
FINE_SHAPE = replace(SERVE_SHAPE, intermediate=256, experts=32, top_k=4)
QUICK_SHAPE = Shape(
    vocab=512,
    hidden=64,
    intermediate=128,
    layers=2,
    heads=4,
    kv_heads=2,
    experts=4,
    top_k=2,
    max_positions=256,
)


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, n: int) -> Workload:
        return Workload(self.prompts[:n], self.max_tokens[:n])

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.max_tokens)

    def blocks(self, block_size: int) -> int:
        """KV blocks that every request holding its whole prompt and output needs at once."""
        pairs = zip(self.prompts, self.max_tokens, strict=True)
        return sum(-(-(len(p) + o) // block_size) for p, o in pairs)


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def make_workload(
    n: int, seed: int, vocab: int, prompt_range: tuple[int, int], output_range: tuple[int, int]
) -> Workload:
    """n requests, prompt and output lengths log-uniform over the ranges, random token ids."""
    rng = random.Random(seed)
    prompts, outputs = [], []
    for _ in range(n):
        length = log_uniform(rng, *prompt_range)
        prompts.append([rng.randrange(1, vocab) for _ in range(length)])
        outputs.append(log_uniform(rng, *output_range))
    return Workload(prompts, outputs)


def build_checkpoint(path: Path, shape: Shape, seed: int) -> Path:
    """Write a seeded random-weight Mixtral checkpoint with `save_pretrained`.

    Weights are scaled by 1/sqrt(fan_in) (the HF init is near zero, which makes greedy
    output degenerate); norms are 1. No EOS: every request runs to its max_tokens.
    """
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        num_local_experts=shape.experts,
        num_experts_per_tok=shape.top_k,
        max_position_embeddings=shape.max_positions,
        sliding_window=None,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=PAD_ID,
    )
    torch.manual_seed(seed)
    model = MixtralForCausalLM(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    model.save_pretrained(path)
    return path


# ---------------------------------------------------------------- results


@dataclass
class RunResult:
    """One run: per-request tokens (own tokens only), TTFT and TPOT, and the wall time."""

    name: str
    config: str
    wall_s: float
    tokens: list[list[int]]
    ttft_s: list[float]
    tpot_s: list[float]
    cpu_s: float = float("nan")
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tok_per_s(self) -> float:
        return self.num_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def tok_per_cpu_s(self) -> float:
        """Tokens per second of process CPU time: less sensitive to other workers' load."""
        return self.num_tokens / self.cpu_s if self.cpu_s > 0 else float("nan")


@contextlib.contextmanager
def timed() -> Iterator[dict[str, float]]:
    """Wall and process CPU seconds of the block, in the yielded dict once it ends."""
    spent: dict[str, float] = {}
    start, cpu0 = time.perf_counter(), time.process_time()
    yield spent
    spent["wall"], spent["cpu"] = time.perf_counter() - start, time.process_time() - cpu0


# ---------------------------------------------------------------- ours


@dataclass
class StepTotals:
    """Our run's steps, summed from their telemetry: stage seconds, forward seconds of steps
    with prefill tokens and of decode-only ones, and each decode-only step's (batch, KV
    tokens, forward ms)."""

    steps: int = 0
    dur_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    split: dict[str, list[float]] = field(
        default_factory=lambda: {"prefill": [0, 0.0], "decode": [0, 0.0]}
    )
    decode_steps: list[tuple[int, int, float]] = field(default_factory=list)

    def add(self, tele: StepTelemetry) -> None:
        self.steps += 1
        for key, value in tele.dur_ms.model_dump().items():
            self.dur_s[key] += value / 1000
        batch = tele.batch
        kind = self.split["prefill" if batch.num_prefill_tokens else "decode"]
        kind[0] += 1
        kind[1] += tele.dur_ms.forward / 1000
        if batch.num_decode_tokens and not batch.num_prefill_tokens:
            ctx = sum(s.ctx for s in batch.slots)
            self.decode_steps.append((batch.num_decode_tokens, ctx, tele.dur_ms.forward))


def make_engine(
    path: Path,
    wl: Workload,
    batching: str,
    max_num_seqs: int,
    max_batched_tokens: int,
    **engine_args: Any,
) -> LLMEngine:
    """An engine whose KV cache holds every request of `wl` at once."""
    return LLMEngine(
        model=str(path),
        batching=batching,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(max_batched_tokens, max_num_seqs),
        num_kv_blocks=wl.blocks(16) + 64,
        block_size=16,
        **engine_args,
    )


def run_ours(engine: LLMEngine, wl: Workload, name: str, config: str) -> RunResult:
    """Add every request at once, step until done, sum the per-step telemetry."""
    totals = StepTotals()
    done: dict[str, Any] = {}
    with timed() as spent:
        now = time.time()
        ids = [
            engine.add_request(
                p, SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True), arrival=now
            )
            for p, o in zip(wl.prompts, wl.max_tokens, strict=True)
        ]
        while engine.has_unfinished():
            result = engine.step()
            totals.add(result.telemetry)
            done.update((o.request_id, o) for o in result.outputs if o.finished)
    outs = [done[i] for i in ids]
    return RunResult(
        name=name,
        config=config,
        wall_s=spent["wall"],
        cpu_s=spent["cpu"],
        tokens=[o.token_ids for o in outs],
        ttft_s=[o.ttft_s for o in outs if o.ttft_s is not None],
        tpot_s=[t for o in outs if (t := o.tpot_s) is not None],
        extra={
            "steps": totals.steps,
            "dur_s": totals.dur_s,
            "decode_steps": totals.decode_steps,
            "split": totals.split,
        },
    )


def warm_workload(vocab: int) -> Workload:
    """Two short greedy requests, 8 and 24 tokens, that start the engine's kernels."""
    return Workload([[1 + i % (vocab - 1) for i in range(n)] for n in (8, 24)], [4, 4])


def warm_ours(engine: LLMEngine, vocab: int) -> None:
    warm = warm_workload(vocab)
    for prompt, n in zip(warm.prompts, warm.max_tokens, strict=True):
        engine.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()


def phase_ours(
    path: Path,
    wl: Workload,
    batching: str,
    max_num_seqs: int,
    max_batched_tokens: int,
    profile: Path | None = None,
) -> RunResult:
    """A fresh engine, warmed up, then one timed run (under cProfile with `profile`)."""
    engine = make_engine(path, wl, batching, max_num_seqs, max_batched_tokens)
    warm_ours(engine, engine.model_config.vocab_size)
    config = (
        f"{batching}, max_num_seqs={max_num_seqs}, "
        f"max_num_batched_tokens={engine.knobs.max_num_batched_tokens}, "
        f"prefill_chunk={engine.knobs.prefill_chunk_size}"
    )
    name = f"moescope {batching}"
    if profile is None:
        return run_ours(engine, wl, name, config)
    import cProfile

    profiler = cProfile.Profile()
    result = profiler.runcall(run_ours, engine, wl, name, config)
    profiler.dump_stats(str(profile))
    return result


# ---------------------------------------------------------------- transformers


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    import transformers

    old = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    cb_logger = logging.getLogger("ContinuousBatchingLogger")
    old_cb = cb_logger.level
    cb_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        transformers.logging.set_verbosity(old)
        transformers.logging.enable_progress_bar()
        cb_logger.setLevel(old_cb)


def load_hf(path: Path) -> Any:
    from transformers import MixtralForCausalLM

    model = MixtralForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = PAD_ID
    return model.eval()


class StepClock:
    """A `generate` streamer that stamps every decoding step (the first put is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def hf_generate_batch(
    model: Any, prompts: list[list[int]], max_new: int
) -> tuple[torch.Tensor, list[float]]:
    """One left-padded greedy batch: its new tokens and each decoding step's time."""
    from transformers import GenerationConfig

    ids, mask = left_pad(prompts)
    clock = StepClock()
    config = GenerationConfig(
        do_sample=False, max_new_tokens=max_new, eos_token_id=None, pad_token_id=PAD_ID
    )
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=config, streamer=clock
        )
    return out[:, ids.shape[1] :], clock.times


def phase_hf_static(path: Path, wl: Workload, batch_size: int) -> RunResult:
    """`generate` in batches of `batch_size`; each request keeps only its own tokens."""
    model = load_hf(path)
    hf_generate_batch(model, wl.prompts[:2], 4)  # warm-up
    tokens: list[list[int]] = []
    ttft: list[float] = []
    tpots: list[float] = []
    with timed() as spent:
        start = time.perf_counter()
        for b in range(0, len(wl), batch_size):
            prompts, lengths = wl.prompts[b : b + batch_size], wl.max_tokens[b : b + batch_size]
            new, times = hf_generate_batch(model, prompts, max(lengths))
            for i, n in enumerate(lengths):
                tokens.append(new[i, :n].tolist())
                ttft.append(times[0] - start)
                if (t := tpot(times[:n])) is not None:
                    tpots.append(t)
            progress(
                f"    batch {b // batch_size + 1}/{-(-len(wl) // batch_size)}: "
                f"{len(prompts)} requests, {max(lengths)} steps, "
                f"{time.perf_counter() - start:.1f} s elapsed"
            )
    config = f"generate, batches of {batch_size}, left padding, runs to batch max"
    return RunResult(
        "transformers generate (static)",
        config,
        spent["wall"],
        tokens,
        ttft,
        tpots,
        spent["cpu"],
    )


@dataclass(frozen=True)
class CBConfig:
    max_batch_tokens: int
    max_requests_per_batch: int

    def __str__(self) -> str:
        return (
            f"max_batch_tokens={self.max_batch_tokens}, "
            f"max_requests_per_batch={self.max_requests_per_batch}"
        )


def parse_grid(text: str) -> list[CBConfig]:
    """ "256x16,512x32" -> [CBConfig(256, 16), CBConfig(512, 32)]."""
    out = []
    for item in text.split(","):
        tokens, requests = item.lower().split("x")
        out.append(CBConfig(int(tokens), int(requests)))
    return out


@contextlib.contextmanager
def hf_cb_manager(model: Any, wl: Workload, cfg: CBConfig, page_size: int) -> Iterator[Any]:
    """transformers' continuous batching, started with room for all of `wl`; stopped after."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    cb_config = ContinuousBatchingConfig(
        page_size=page_size,
        num_blocks=wl.blocks(page_size) + cfg.max_requests_per_batch,
        max_batch_tokens=cfg.max_batch_tokens,
        max_requests_per_batch=cfg.max_requests_per_batch,
    )
    gen_config = GenerationConfig(
        do_sample=False, max_new_tokens=max(wl.max_tokens), eos_token_id=None, pad_token_id=PAD_ID
    )
    manager = model.init_continuous_batching(
        generation_config=gen_config, continuous_batching_config=cb_config
    )
    manager.start()
    try:
        yield manager
    finally:
        manager.stop(block=True)
        manager.destroy()


def run_hf_cb(model: Any, wl: Workload, cfg: CBConfig, page_size: int) -> RunResult:
    """Every request at once into transformers' continuous batching, until all finish."""
    with hf_cb_manager(model, wl, cfg, page_size) as manager, timed() as spent:
        start = time.perf_counter()
        ids = [
            manager.add_request(p, max_new_tokens=o, record_timestamps=True)
            for p, o in zip(wl.prompts, wl.max_tokens, strict=True)
        ]
        done: dict[str, Any] = {}
        while len(done) < len(ids):
            res = manager.get_result(timeout=1)
            if res is None and not manager.is_running():
                raise RuntimeError("transformers continuous batching thread stopped")
            if res is not None and res.is_finished():
                done[res.request_id] = res
    outs = [done[i] for i in ids]
    return RunResult(
        name="transformers continuous batching",
        config=str(cfg),
        wall_s=spent["wall"],
        cpu_s=spent["cpu"],
        tokens=[list(o.generated_tokens) for o in outs],
        ttft_s=[o.timestamps[0] - start for o in outs if o.timestamps],
        tpot_s=[t for o in outs if o.timestamps and (t := tpot(o.timestamps)) is not None],
    )


def tune_hf_cb(
    model: Any, wl: Workload, grid: list[CBConfig], tune_requests: int, page_size: int
) -> tuple[CBConfig, list[tuple[CBConfig, float]]]:
    """The grid point with the best tok/s on the first `tune_requests` requests."""
    run_hf_cb(model, wl.subset(min(2, len(wl))), grid[0], page_size)  # warm-up
    if len(grid) == 1:
        return grid[0], []
    subset = wl.subset(min(tune_requests, len(wl)))
    sweep: list[tuple[CBConfig, float]] = []
    for cfg in grid:
        r = run_hf_cb(model, subset, cfg, page_size)
        sweep.append((cfg, r.tok_per_s))
        progress(f"    sweep {cfg}: {r.tok_per_s:.1f} tok/s on {len(subset)} requests")
    return max(sweep, key=lambda p: p[1])[0], sweep


def timed_steps(engine: LLMEngine) -> list[tuple[float, int, int]]:
    """Step until done: each step's wall ms, running sequences and prefill tokens."""
    out = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        result = engine.step()
        ms = (time.perf_counter() - t0) * 1000
        batch = result.telemetry.batch
        out.append((ms, len(batch.slots), batch.num_prefill_tokens))
    return out


def ours_decode_ms(engine: LLMEngine, batch: int, prompt: int, tokens: int) -> float:
    """Median wall ms of the steps in which all `batch` sequences decode."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    vocab = engine.model_config.vocab_size
    for i in range(batch):
        engine.add_request([1 + (i * 7 + j) % (vocab - 1) for j in range(prompt)], params)
    steps = timed_steps(engine)
    return statistics.median(ms for ms, n, pre in steps if n == batch and pre == 0)
