"""Offline throughput: moescope vs `transformers` on one seeded workload, back to back.

All requests arrive at once. Four runs on the same Mixtral-shaped checkpoint:

1. ours, continuous batching (`engine.LLMEngine` driven step by step for its telemetry);
2. ours, static batching (`batching="static"`, batches of `--static-batch`);
3. `transformers` `generate` in static batches of `--static-batch` (left padding, greedy,
   each batch runs to its longest request; only each request's own tokens are counted);
4. `transformers`' own continuous batching (`init_continuous_batching`), after a sweep of
   `max_batch_tokens` x `max_requests_per_batch` on a subset of the workload.

With `--repeats N` the four runs are timed in N interleaved rounds and each row keeps its
fastest run (the machine is shared; other load comes and goes). Every row also reports its
process CPU time, a measure that other processes disturb much less than wall time.

Prints a progress line per phase and a Markdown table, and writes a section of
benchmarks/RESULTS.md. Run: `python benchmarks/offline_throughput.py` (`--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import math
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from results_md import write_section

from engine import LLMEngine, SamplingParams

RESULTS_PATH = Path(__file__).resolve().parent / "RESULTS.md"
BEGIN = "<!-- offline_throughput:begin -->"
END = "<!-- offline_throughput:end -->"
PAD_ID = 0


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


def percentiles(values: list[float], qs: tuple[float, ...] = (50, 90, 99)) -> list[float]:
    if not values:
        return [float("nan")] * len(qs)
    return [float(np.percentile(values, q)) for q in qs]


def tpot(times: list[float]) -> float | None:
    """Mean time per output token after the first."""
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of requests whose greedy tokens are identical."""
    return sum(x == y for x, y in zip(a, b, strict=True)) / max(len(a), 1)


def progress(message: str) -> None:
    print(message, flush=True)


# ---------------------------------------------------------------- ours


def kv_blocks_needed(wl: Workload, block_size: int) -> int:
    per_request = (
        -(-(len(p) + o) // block_size) for p, o in zip(wl.prompts, wl.max_tokens, strict=True)
    )
    return sum(per_request) + 64


def make_engine(
    path: Path, wl: Workload, batching: str, max_num_seqs: int, max_batched_tokens: int
) -> LLMEngine:
    return LLMEngine(
        model=str(path),
        batching=batching,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(max_batched_tokens, max_num_seqs),
        num_kv_blocks=kv_blocks_needed(wl, 16),
        block_size=16,
    )


def run_ours(engine: LLMEngine, wl: Workload, name: str, config: str) -> RunResult:
    """Add every request at once, step until done, sum the per-step telemetry durations."""
    dur = dict.fromkeys(("schedule", "prepare", "forward", "moe", "sample", "total"), 0.0)
    steps = 0
    done: dict[str, Any] = {}
    start, cpu0 = time.perf_counter(), time.process_time()
    now = time.time()
    ids = [
        engine.add_request(
            p, SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True), arrival=now
        )
        for p, o in zip(wl.prompts, wl.max_tokens, strict=True)
    ]
    decode_steps: list[tuple[int, int, float]] = []
    split = {"prefill": [0, 0.0], "decode": [0, 0.0]}
    while engine.has_unfinished():
        result = engine.step()
        steps += 1
        tele = result.telemetry
        for key, value in tele.dur_ms.model_dump().items():
            dur[key] += value / 1000
        kind = split["prefill" if tele.batch.num_prefill_tokens else "decode"]
        kind[0] += 1
        kind[1] += tele.dur_ms.forward / 1000
        if tele.batch.num_decode_tokens and not tele.batch.num_prefill_tokens:
            ctx = sum(s.ctx for s in tele.batch.slots)
            decode_steps.append((tele.batch.num_decode_tokens, ctx, tele.dur_ms.forward))
        for out in result.outputs:
            if out.finished:
                done[out.request_id] = out
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    outs = [done[i] for i in ids]
    return RunResult(
        name=name,
        config=config,
        wall_s=wall,
        cpu_s=cpu,
        tokens=[o.token_ids for o in outs],
        ttft_s=[o.ttft_s for o in outs if o.ttft_s is not None],
        tpot_s=[t for o in outs if (t := o.tpot_s) is not None],
        extra={"steps": steps, "dur_s": dur, "decode_steps": decode_steps, "split": split},
    )


def warm_ours(engine: LLMEngine, vocab: int) -> None:
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for n in (8, 24):
        engine.add_request([1 + i % (vocab - 1) for i in range(n)], params)
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
    model = load_hf(path)
    hf_generate_batch(model, wl.prompts[:2], 4)  # warm-up
    tokens: list[list[int]] = []
    ttft: list[float] = []
    tpots: list[float] = []
    start, cpu0 = time.perf_counter(), time.process_time()
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
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    config = f"generate, batches of {batch_size}, left padding, runs to batch max"
    return RunResult("transformers generate (static)", config, wall, tokens, ttft, tpots, cpu)


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


def run_hf_cb(model: Any, wl: Workload, cfg: CBConfig, page_size: int) -> RunResult:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    blocks = sum(
        -(-(len(p) + o) // page_size) for p, o in zip(wl.prompts, wl.max_tokens, strict=True)
    )
    cb_config = ContinuousBatchingConfig(
        page_size=page_size,
        num_blocks=blocks + cfg.max_requests_per_batch,
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
        start, cpu0 = time.perf_counter(), time.process_time()
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
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    finally:
        manager.stop(block=True)
        manager.destroy()
    outs = [done[i] for i in ids]
    return RunResult(
        name="transformers continuous batching",
        config=str(cfg),
        wall_s=wall,
        cpu_s=cpu,
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


# ---------------------------------------------------------------- report


def fmt3(values: list[float], digits: int) -> str:
    return " / ".join("-" if math.isnan(v) else f"{v:.{digits}f}" for v in values)


def render_table(results: list[RunResult], ref: RunResult) -> str:
    header = (
        "| run | config | wall s | out tok/s | TTFT ms p50 / p90 / p99 "
        "| TPOT ms p50 / p90 / p99 | agreement with ours | ours speedup "
        "| CPU s | ours speedup on CPU time |"
    )
    lines = [header, "|" + " --- |" * 10]
    for r in results:
        ttft = [v * 1000 for v in percentiles(r.ttft_s)]
        tp = [v * 1000 for v in percentiles(r.tpot_s)]
        speedup = ref.tok_per_s / r.tok_per_s
        cpu_speedup = ref.tok_per_cpu_s / r.tok_per_cpu_s
        lines.append(
            f"| {r.name} | {r.config} | {r.wall_s:.1f} | {r.tok_per_s:.1f} | {fmt3(ttft, 0)} "
            f"| {fmt3(tp, 1)} | {agreement(r.tokens, ref.tokens):.0%} | {speedup:.2f}x "
            f"| {r.cpu_s:.1f} | {cpu_speedup:.2f}x |"
        )
    return "\n".join(lines)


def render_repeats(by_key: dict[str, RunResult]) -> list[str]:
    """With --repeats, the wall time of every repeat (the table shows the fastest)."""
    runs = [r for r in by_key.values() if len(r.extra.get("walls", [])) > 1]
    if not runs:
        return []
    walls = "; ".join(f"{r.name} " + " / ".join(f"{w:.1f}" for w in r.extra["walls"]) for r in runs)
    return [
        f"Each row is the fastest of {len(runs[0].extra['walls'])} timed runs, taken in "
        f"interleaved rounds (all four runs, then again); wall s of every run: {walls}.",
        "",
    ]


def render_breakdown(ours: RunResult) -> str:
    dur = ours.extra["dur_s"]
    inside = dur["total"]
    outside = ours.wall_s - inside
    parts = [
        ("schedule", dur["schedule"]),
        ("prepare", dur["prepare"]),
        ("forward", dur["forward"]),
        ("  of which MoE", dur["moe"]),
        ("sample + update", dur["sample"]),
        (
            "rest of step (KV swap)",
            inside - dur["schedule"] - dur["prepare"] - dur["forward"] - dur["sample"],
        ),
        ("outside the timed step (telemetry record, add_request, loop)", outside),
    ]
    lines = ["| part of the continuous run | s | share of wall |", "| --- | --- | --- |"]
    lines += [f"| {name} | {s:.2f} | {s / ours.wall_s:.1%} |" for name, s in parts]
    return "\n".join(lines)


def render_split(runs: list[RunResult]) -> str:
    """Forward time of steps that carry prefill tokens vs decode-only steps, per run of ours."""
    lines = [
        "| our run | steps | steps with prefill tokens: count, forward s "
        "| decode-only steps: count, forward s |",
        "| --- | --- | --- | --- |",
    ]
    for r in runs:
        pre, dec = r.extra["split"]["prefill"], r.extra["split"]["decode"]
        lines.append(
            f"| {r.name} | {r.extra['steps']} | {pre[0]}, {pre[1]:.2f} | {dec[0]}, {dec[1]:.2f} |"
        )
    return "\n".join(lines)


BATCH_BINS = ((1, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 1 << 20))


def render_decode_cost(runs: list[RunResult]) -> str:
    """Decode-only steps of our runs binned by batch size: what one step and one token cost."""
    rows = [r for run in runs for r in run.extra.get("decode_steps", [])]
    if not rows:
        return ""
    lines = [
        "Decode-only steps of our runs by batch size (how batching amortises a step):",
        "",
        "| batch | steps | mean KV tokens | forward ms per step | forward ms per token |",
        "| --- | --- | --- | --- | --- |",
    ]
    for lo, hi in BATCH_BINS:
        sel = [(b, kv, ms) for b, kv, ms in rows if lo <= b <= hi]
        if not sel:
            continue
        per_step = sum(ms for *_, ms in sel) / len(sel)
        per_token = sum(ms for *_, ms in sel) / sum(b for b, *_ in sel)
        kv = sum(k for _, k, _ in sel) / len(sel)
        label = f"{lo}-{hi}" if hi < 1 << 20 else f">= {lo}"
        lines.append(f"| {label} | {len(sel)} | {kv:.0f} | {per_step:.1f} | {per_token:.2f} |")
    return "\n".join(lines)


def render_sweep(sweep: list[tuple[CBConfig, float]], n: int) -> str:
    if not sweep:
        return ""
    lines = [
        f"transformers continuous-batching sweep on the first {n} requests:",
        "",
        "| max_batch_tokens | max_requests_per_batch | out tok/s |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {c.max_batch_tokens} | {c.max_requests_per_batch} | {tps:.1f} |" for c, tps in sweep
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    text: str
    value: float
    goal: float
    higher_is_better: bool = True
    cpu_value: float | None = None

    @property
    def met(self) -> bool:
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        mark = "met" if self.met else "MISSED"
        cpu = "" if self.cpu_value is None else f"; on CPU time {self.cpu_value:.2f}x"
        return f"- [{mark}] {self.text}: {self.value:.2f}x (target {op} {self.goal}x{cpu})"


def targets(by_key: dict[str, RunResult]) -> list[Target]:
    ours = by_key["ours"]
    out = []
    for key, text, goal in (
        ("hf_cb", "ours vs transformers' best continuous batching", 1.8),
        ("hf_static", "ours vs transformers static generate", 4.0),
        ("ours_static", "our continuous vs our static", 2.0),
    ):
        if key in by_key:
            other = by_key[key]
            out.append(
                Target(
                    text,
                    ours.tok_per_s / other.tok_per_s,
                    goal,
                    cpu_value=ours.tok_per_cpu_s / other.tok_per_cpu_s,
                )
            )
    forward = ours.extra["dur_s"]["forward"]
    out.append(
        Target(
            "our wall time vs forward-only bound",
            ours.wall_s / forward,
            1.15,
            higher_is_better=False,
        )
    )
    return out


def engine_revision() -> str:
    """The engine code that ran: git commit of the imported `engine` package, dirty or not."""
    import engine

    root = Path(engine.__file__).resolve().parents[1]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "engine", "kernels"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"
    return f"commit {rev}" + (" with uncommitted changes in engine/ or kernels/" if dirty else "")


def render_section(
    args: argparse.Namespace,
    argv: list[str],
    shape: Shape,
    wl: Workload,
    by_key: dict[str, RunResult],
    sweep: list[tuple[CBConfig, float]],
    runtime_s: float,
) -> str:
    import transformers

    ours = by_key["ours"]
    ours_runs = [r for k, r in by_key.items() if k in ("ours", "ours_static")]
    forward = ours.extra["dur_s"]["forward"]
    cmd = " ".join(["python benchmarks/offline_throughput.py", *map(shlex.quote, argv)])
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        BEGIN,
        "## Offline throughput (`benchmarks/offline_throughput.py`)",
        "",
        f"- Command: `{cmd.strip()}`",
        f"- Date: {date}; total runtime {runtime_s / 60:.1f} min",
        f"- Machine: 2 CPU cores, shared (other workers run tests at the same time, so absolute "
        f"numbers are noisy; the ratios come from runs side by side in one process); "
        f"torch {torch.__version__} with {args.threads} intra-op thread(s), transformers "
        f"{transformers.__version__}, Python {platform.python_version()}",
        f"- Engine code: {engine_revision()}",
        f"- Model: {shape.describe()}",
        f"- Workload: {len(wl)} requests arriving at once, seed {args.seed}, prompt lengths "
        f"log-uniform {args.prompt_range[0]}..{args.prompt_range[1]} "
        f"({wl.num_prompt_tokens} tokens), output lengths log-uniform "
        f"{args.output_range[0]}..{args.output_range[1]} ({wl.num_output_tokens} tokens), "
        "greedy, EOS ignored",
        "- TTFT counts from the moment all requests arrive (so it includes queueing); TPOT is "
        "each request's mean time per token after its first. Agreement: share of requests "
        "whose greedy tokens equal ours (continuous). Speedup: our continuous tok/s over the "
        "row's.",
        "",
        render_table(list(by_key.values()), ours),
        "",
        *render_repeats(by_key),
        f"Forward-only bound of our continuous run: {forward:.2f} s summed "
        f"`StepTelemetry.dur_ms.forward` over {ours.extra['steps']} steps; wall / forward = "
        f"{ours.wall_s / forward:.3f}.",
        "",
        render_breakdown(ours),
        "",
        render_split(ours_runs),
        "",
        render_decode_cost(ours_runs),
        "",
    ]
    if sweep:
        parts += [render_sweep(sweep, min(args.cb_tune_requests, len(wl))), ""]
    parts += ["Targets:", "", *(t.line() for t in targets(by_key)), END]
    return "\n".join(parts)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=None, help="default 128 (8 with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny model and lengths: a smoke run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for every run (default 1: see RESULTS.md)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="timed runs per row; the fastest is reported (rejects interference "
        "from other load on a shared machine)",
    )
    p.add_argument("--max-num-seqs", type=int, default=128, help="ours, continuous")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="ours")
    p.add_argument(
        "--static-batch",
        type=int,
        default=None,
        help="batch size of both static runs (default 32, 4 with --quick)",
    )
    p.add_argument(
        "--cb-grid",
        default=None,
        help="transformers CB sweep, e.g. '256x16,512x32' (max_batch_tokens x "
        "max_requests_per_batch)",
    )
    p.add_argument(
        "--cb-tune-requests",
        type=int,
        default=64,
        help="requests in the transformers CB sweep (then the best runs on all)",
    )
    p.add_argument("--cb-page-size", type=int, default=None)
    p.add_argument("--skip-ours-static", action="store_true")
    p.add_argument("--skip-hf-static", action="store_true")
    p.add_argument("--skip-hf-cb", action="store_true")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="directory for the checkpoint (default: a temporary one)",
    )
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help="RESULTS.md to update (default benchmarks/RESULTS.md; --quick writes "
        "nothing unless given)",
    )
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    p.add_argument(
        "--profile", type=Path, default=None, help="write cProfile stats of our continuous run here"
    )
    args = p.parse_args(argv)
    quick = args.quick
    args.requests = args.requests or (8 if quick else 128)
    args.static_batch = args.static_batch or (4 if quick else 32)
    args.cb_grid = parse_grid(
        args.cb_grid or ("64x4" if quick else "256x16,512x32,1024x64,2048x128,512x128,2048x32")
    )
    args.cb_page_size = args.cb_page_size or (16 if quick else 256)
    args.prompt_range = (4, 32) if quick else (16, 512)
    args.output_range = (2, 16) if quick else (8, 256)
    if quick:
        args.max_num_seqs = min(args.max_num_seqs, 16)
        args.max_num_batched_tokens = min(args.max_num_batched_tokens, 256)
    if args.results is None and not quick:
        args.results = RESULTS_PATH
    return args


Phase = tuple[str, str, Callable[[], RunResult]]  # key, label, one timed run


def make_phases(
    args: argparse.Namespace, path: Path, wl: Workload, sweep: list[tuple[CBConfig, float]]
) -> list[Phase]:
    """The runs to time, in order; transformers' CB is tuned here, before any timed round."""
    phases: list[Phase] = [
        (
            "ours",
            "moescope continuous",
            lambda: phase_ours(
                path, wl, "continuous", args.max_num_seqs, args.max_num_batched_tokens, args.profile
            ),
        )
    ]
    if not args.skip_ours_static:
        phases.append(
            (
                "ours_static",
                "moescope static",
                lambda: phase_ours(
                    path, wl, "static", args.static_batch, args.max_num_batched_tokens
                ),
            )
        )
    if not args.skip_hf_static:
        phases.append(
            (
                "hf_static",
                "transformers generate (static)",
                lambda: phase_hf_static(path, wl, args.static_batch),
            )
        )
    if not args.skip_hf_cb:
        progress("tuning transformers continuous batching ...")
        with quiet_transformers():
            model = load_hf(path)
            best, points = tune_hf_cb(
                model, wl, args.cb_grid, args.cb_tune_requests, args.cb_page_size
            )
        sweep.extend(points)
        progress(f"tuning done: {best}")

        def cb() -> RunResult:
            result = run_hf_cb(model, wl, best, args.cb_page_size)
            result.config = f"{best}, page_size={args.cb_page_size} (best of {len(args.cb_grid)})"
            return result

        phases.append(("hf_cb", "transformers continuous batching", cb))
    return phases


def run_all(
    args: argparse.Namespace, path: Path, wl: Workload
) -> tuple[dict[str, RunResult], list[tuple[CBConfig, float]]]:
    """`--repeats` rounds over every phase (interleaved, so each side sees the machine's load
    at several moments); each row keeps its fastest run, with every wall time in extra."""
    sweep: list[tuple[CBConfig, float]] = []
    phases = make_phases(args, path, wl, sweep)
    runs: dict[str, list[RunResult]] = {key: [] for key, _, _ in phases}
    for rnd in range(args.repeats):
        for i, (key, label, fn) in enumerate(phases, 1):
            tag = f"[{i}/{len(phases)}]" + (
                f" round {rnd + 1}/{args.repeats}" if args.repeats > 1 else ""
            )
            progress(f"{tag} {label} ...")
            with quiet_transformers() if key.startswith("hf") else contextlib.nullcontext():
                result = fn()
            runs[key].append(result)
            progress(
                f"{tag} {label}: {result.num_tokens} tokens in {result.wall_s:.1f} s = "
                f"{result.tok_per_s:.1f} tok/s ({result.cpu_s:.1f} s CPU)"
            )
    by_key = {}
    for key, results in runs.items():
        best = min(results, key=lambda r: r.wall_s)
        best.extra["walls"] = [r.wall_s for r in results]
        by_key[key] = best
    return by_key, sweep


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark; returns the Markdown section (also printed and maybe written)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = QUICK_SHAPE if args.quick else FULL_SHAPE
    wl = make_workload(args.requests, args.seed, shape.vocab, args.prompt_range, args.output_range)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="moescope-bench-") as tmp:
        path = args.checkpoint or Path(tmp) / "mixtral"
        if not (path / "config.json").exists():
            progress(f"building checkpoint at {path}")
            with quiet_transformers():
                build_checkpoint(path, shape, args.seed)
        progress(
            f"workload: {len(wl)} requests, {wl.num_prompt_tokens} prompt tokens, "
            f"{wl.num_output_tokens} output tokens"
        )
        by_key, sweep = run_all(args, path, wl)
    section = render_section(args, argv, shape, wl, by_key, sweep, time.perf_counter() - started)
    print(section)
    if args.results is not None and not args.no_write:
        write_section(args.results, section, BEGIN, END)
        progress(f"wrote {args.results}")
    return section


if __name__ == "__main__":
    main()
