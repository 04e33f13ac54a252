"""`moescope serve` against llama.cpp's `llama-server` on the same weights and precision.

One seeded Mixtral-shaped checkpoint, converted to GGUF by llama.cpp's own script at f32 and
bf16 (`build.py` builds and converts, cached outside the repo). One async client here
drives both servers alike: every request of the workload sent at once, token-id prompts,
greedy, EOS ignored, each response checked to hold exactly its requested token count;
throughput is output tokens over the wall time from the first send to the last response.
Before timing, the first greedy tokens of a few prompts are compared between the two.
llama.cpp's slots, threads, micro-batch and flash attention are swept on the workload first
and its best setting is timed. Each server runs in a fresh subprocess per run, warmed up;
the runs alternate (llama.cpp, moescope, moescope A/A) for `--repeats` rounds. Writes a
section of benchmarks/RESULTS.md. Never run in CI (it builds llama.cpp: ~11 min on 2 cores).
Run: `python -m benchmarks.peer.llamacpp` (`--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.results_md import add_results_arguments, publish, results_path
from benchmarks.peer import build as peer_build
from benchmarks.peer import report
from benchmarks.peer.runs import (
    DTYPES,
    OUTPUT_RANGE,
    PROMPT_RANGE,
    SHAPES,
    Context,
    LlamaSetting,
    OursContext,
    Run,
    Server,
    add_quiet_argument,
    cached_checkpoint,
    kv_blocks,
    llama,
    llama_run,
    moescope_run,
    offline_run,
    progress,
    request_body,
)
from benchmarks.speed.offline_runners import Workload, make_workload

AGREE_PROMPTS, AGREE_TOKENS = 4, 32
ENGINES = ("llama.cpp", "moescope", "moescope offline", "moescope A/A")  # each round's order


# ---------------------------------------------------------------- agreement


def llama_tokens(server: Server, prompts: list[list[int]], n: int) -> list[list[int]]:
    """llama-server's greedy tokens, one request at a time."""
    out = []
    for p in prompts:
        path, body = request_body("llama.cpp", p, n, tokens=True)
        reply = httpx.post(server.url + path, json=body, timeout=120)
        reply.raise_for_status()
        out.append(reply.json()["tokens"])
    return out


def moescope_tokens(model: Path, dtype: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    """moescope's greedy tokens (the engine `moescope serve` runs, here in process; the
    server's replies carry text, and this checkpoint has no tokenizer)."""
    from engine import LLM, SamplingParams

    llm = LLM(str(model), dtype=dtype, num_kv_blocks=256)
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, [params] * len(prompts))]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    pairs = zip(a, b, strict=False)  # either may be shorter
    return next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(a), len(b)))


def agreement(ctx: Context, precision: str, wl: Workload) -> list[dict[str, Any]]:
    """Per prompt: its length and how many leading greedy tokens the two engines share
    (llama-server with `-fa off` and the KV cache at the run's precision); below f32, also
    how many each shares with moescope at f32."""
    prompts = wl.prompts[:AGREE_PROMPTS]
    gguf, setting = ctx.gguf[precision], LlamaSetting(4)
    with llama(ctx.bins, gguf, setting, ctx.slot_ctx, precision, ctx.quiet_s) as s:
        theirs = llama_tokens(s, prompts, AGREE_TOKENS)
    ours = moescope_tokens(ctx.model, DTYPES[precision], prompts, AGREE_TOKENS)
    ref = (
        ours if precision == "f32" else moescope_tokens(ctx.model, "float32", prompts, AGREE_TOKENS)
    )
    rows = [
        {
            "prompt": len(p),
            "same": common_prefix(a, b),
            "llama_vs_f32": common_prefix(a, r),
            "moescope_vs_f32": common_prefix(b, r),
            "of": AGREE_TOKENS,
        }
        for p, a, b, r in zip(prompts, theirs, ours, ref, strict=True)
    ]
    progress(f"{precision} agreement (leading tokens equal): {[r['same'] for r in rows]}")
    return rows


# ---------------------------------------------------------------- sweep and rounds


def sweep(ctx: Context, precision: str, wl: Workload, skip: bool) -> tuple[LlamaSetting, list[Run]]:
    """llama.cpp's best setting by coordinate search (slots, then threads, then micro-batch,
    then flash attention; each stage keeps the fastest on `wl`) and every tried setting's run;
    `skip`: `-np 16` and the defaults (the f32 sweep's best on this workload), untried."""
    best, tried = LlamaSetting(min(16, len(wl)), ctx.threads), list[Run]()
    if skip:
        return best, tried
    scores: dict[LlamaSetting, float] = {}

    def trial(settings: list[LlamaSetting]) -> LlamaSetting:
        for s in settings:
            if s not in scores:
                run = llama_run(ctx, precision, s, wl)
                scores[s] = run.tok_s
                tried.append(run)
                progress(f"{precision} sweep {s}: {run.tok_s:.1f} tok/s")
        return max(scores, key=scores.__getitem__)

    best = trial([replace(best, parallel=n) for n in (16, 32, 64, 128)])
    # the fastest slot count is the smallest tried: halve it while that still helps
    while best.parallel > 1 and best.parallel == min(s.parallel for s in scores):
        fewer = trial([replace(best, parallel=best.parallel // 2)])
        if fewer == best:
            break
        best = fewer
    best = trial([replace(best, threads=t) for t in (1, 2)])
    best = trial([replace(best, ubatch=u) for u in (128, 512, 2048)])
    return trial([replace(best, flash=f) for f in ("off", "on")]), tried


def rounds(ctx: Context, precision: str, setting: LlamaSetting, wl: Workload, n: int) -> list[Run]:
    """`n` rounds of llama.cpp, moescope, moescope again (the A/A control), in that order."""
    runs: list[Run] = []
    for r in range(n):
        for engine in ENGINES:
            if engine == "llama.cpp":
                run = llama_run(ctx, precision, setting, wl)
            elif engine == "moescope offline":
                run = offline_run(ctx, precision)
            else:
                run = moescope_run(ctx, precision, wl)
                run.engine = engine
            run.extra["round"] = r + 1
            runs.append(run)
            progress(
                f"{precision} round {r + 1} {engine}: {run.tok_s:.1f} tok/s "
                f"({run.wall_s:.1f} s, server CPU {run.cpu_s:.1f} s)"
            )
    return runs


def summarize(runs: list[Run]) -> dict[str, float]:
    """Median tok/s per engine, the ratios moescope serve / llama.cpp and serve / offline,
    and the A/A ratio."""
    med = {e: statistics.median(r.tok_s for r in runs if r.engine == e) for e in ENGINES}
    return {
        **med,
        "ratio": med["moescope"] / med["llama.cpp"],
        "offline_ratio": med["moescope"] / med["moescope offline"],
        "aa": med["moescope A/A"] / med["moescope"],
    }


# ---------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=["f32", "bf16", "both"], default="both")
    p.add_argument("--shape", choices=list(SHAPES), default="serve", help="the model's MoE shape")
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds per precision")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="threads of each server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="16 requests, 1 round, no sweep")
    p.add_argument(
        "--no-sweep",
        action="store_true",
        help="time llama.cpp at -np 16 -ub 512 -fa off (the f32 sweep's best) untried",
    )
    add_quiet_argument(p)
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.repeats = 16, 1
    return args


def prepare(args: argparse.Namespace, precisions: list[str], wl: Workload) -> Context:
    """Build llama.cpp, the checkpoint and its GGUFs (each only if not cached)."""
    src = peer_build.fetch_source()
    bins = peer_build.build(src)
    shape = SHAPES[args.shape]
    model = cached_checkpoint(shape, args.seed)
    gguf = {p: peer_build.convert(src, model, shape.vocab, p) for p in precisions}
    longest = max(len(p) + n for p, n in zip(wl.prompts, wl.max_tokens, strict=True))
    slot_ctx = -(-longest // 256) * 256
    ours = OursContext(
        shape, model, kv_blocks(wl), args.threads, len(wl), args.seed, args.quiet_wait
    )
    return Context(**vars(ours), source=src, bins=bins, gguf=gguf, slot_ctx=slot_ctx)


def measure(ctx: Context, precision: str, wl: Workload, args: argparse.Namespace) -> dict:
    """One precision: agreement, sweep, the alternating rounds and their medians."""
    started = time.perf_counter()
    agree = agreement(ctx, precision, wl)
    best, tried = sweep(ctx, precision, wl, args.quick or args.no_sweep)
    progress(f"{precision}: llama.cpp best setting {best}")
    runs = rounds(ctx, precision, best, wl, args.repeats)
    return {
        "agreement": agree,
        "sweep": tried,
        "best": best,
        "runs": runs,
        "summary": summarize(runs),
        "runtime_s": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Build, then per precision measure and publish its own section; returns per precision
    the agreement, sweep, best setting, runs and medians."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    precisions = ["f32", "bf16"] if args.precision == "both" else [args.precision]
    wl = make_workload(
        args.requests, args.seed, SHAPES[args.shape].vocab, PROMPT_RANGE, OUTPUT_RANGE
    )
    started = time.perf_counter()
    ctx = prepare(args, precisions, wl)
    args.prepare_s = time.perf_counter() - started
    progress(f"workload: {len(wl)} requests, {wl.num_output_tokens} output tokens")
    out: dict[str, Any] = {}
    for precision in precisions:
        out[precision] = res = measure(ctx, precision, wl, args)
        text = report.render(args, argv, ctx, wl, precision, res)
        publish(report.section(precision, args.shape), text, results_path(args))
    return out


if __name__ == "__main__":
    main()
