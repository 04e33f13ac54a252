"""MLA against GQA on the CPU: decode tokens per second and KV cache bytes per token (issue 46).

`synthetic:dsv2-lite` (DeepSeek-V2-Lite's shape, widths divided by 8, 6 layers: latent
attention caching 64 + 8 values per token and layer) against `synthetic:dsv2-lite-gqa`, the
same model with 16-head / 8-KV-head grouped-query attention in place of MLA (within 1% of its
parameters, caching 2 x 8 x 16 values). Each engine gets the KV blocks a fixed KV memory
budget buys at its own bytes per token (`kv_cache_memory_mib`), so the table shows how many
tokens (and requests) the budget holds. Decode: N requests of P-token prompts, greedy, no
EOS; once all decode, the engines step in alternating blocks, and tok/s is N over the median
step's wall time (and over its forward time, `dur_ms.forward`). "MLA (A/A)" is a second MLA
engine, the noise floor.

Writes its section of benchmarks/RESULTS.md.

    python -m benchmarks.speed.mla_vs_gqa         # --quick for a smoke run (writes nothing)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

import torch

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from engine import LLMEngine, SamplingParams

SECTION = "mla_vs_gqa"
BLOCK_SIZE = 16
ARMS = {
    "MLA": "synthetic:dsv2-lite",
    "GQA": "synthetic:dsv2-lite-gqa",
    "MLA (A/A)": "synthetic:dsv2-lite",
}


def kv_bytes_per_token(engine: LLMEngine) -> int:
    """One token's KV cache bytes in one layer, as /api/status reports it."""
    cfg = engine.model_config
    return cfg.kv_elements_per_token * engine.config.dtype.itemsize


def make_engine(model: str, budget_mib: int, running: int) -> LLMEngine:
    """An engine whose KV blocks are what `budget_mib` buys at this model's bytes per token."""
    return LLMEngine(
        model=model,
        kv_cache_memory_mib=budget_mib,
        block_size=BLOCK_SIZE,
        max_num_seqs=running,
        max_num_batched_tokens=max(2048, running),
        enable_prefix_caching=False,
    )


def run(running: int, prompt: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every arm's row for `running` requests of `prompt`-token prompts."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 250) for _ in range(prompt)] for _ in range(running)]
    params = SamplingParams(max_tokens=10**6, temperature=0.0, ignore_eos=True)
    engines = {arm: make_engine(model, args.budget_mib, running) for arm, model in ARMS.items()}
    for engine in engines.values():
        for ids in prompts:
            engine.add_request(ids, params)
        while engine.step().telemetry.batch.num_prefill_tokens or not _all_decoding(engine):
            pass
    walls: dict[str, list[float]] = {arm: [] for arm in engines}
    forwards: dict[str, list[float]] = {arm: [] for arm in engines}
    for _ in range(args.steps // args.block):
        for arm, engine in engines.items():
            for _ in range(args.block):
                t0 = time.perf_counter()
                step = engine.step()
                walls[arm].append(time.perf_counter() - t0)
                forwards[arm].append(step.telemetry.dur_ms.forward / 1000)
                assert step.telemetry.batch.num_decode_tokens == running
    rows = {}
    for arm, engine in engines.items():
        cfg, per_token = engine.model_config, kv_bytes_per_token(engine)
        blocks = engine.config.cache.num_blocks
        rows[arm] = {
            "params_m": sum(p.numel() for p in engine.model.parameters()) / 1e6,
            "kv_bytes_per_token_layer": per_token,
            "kv_bytes_per_token": per_token * cfg.num_layers,
            "blocks": blocks,
            "tokens": blocks * BLOCK_SIZE,
            "decode_tok_s": running / statistics.median(walls[arm]),
            "forward_tok_s": running / statistics.median(forwards[arm]),
        }
    return rows


def _all_decoding(engine: LLMEngine) -> bool:
    stats = engine.scheduler.stats()
    return stats.waiting == 0 and stats.running > 0


def render(
    running: int, prompt: int, rows: dict[str, dict[str, Any]], args: argparse.Namespace
) -> list[str]:
    length = prompt + args.steps + 8  # a request's tokens by the end, warm-up included
    lines = [
        f"{running} requests of {prompt}-token prompts decoding:",
        "",
        "| arm | params (M) | KV bytes / token / layer | KV bytes / token | blocks in budget "
        f"| tokens in budget | requests of {length} tokens in budget | decode tok/s "
        "| forward tok/s | tok/s vs GQA |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    gqa = rows["GQA"]["decode_tok_s"]
    for arm, r in rows.items():
        lines.append(
            f"| {arm} | {r['params_m']:.1f} | {r['kv_bytes_per_token_layer']} | "
            f"{r['kv_bytes_per_token']} | {r['blocks']} | {r['tokens']} | "
            f"{r['blocks'] // -(-length // BLOCK_SIZE)} | "
            f"{r['decode_tok_s']:.0f} | {r['forward_tok_s']:.0f} | "
            f"{r['decode_tok_s'] / gqa:.2f} |"
        )
    return lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--workloads",
        nargs="+",
        default=["32x256", "8x1024"],
        help="RUNNINGxPROMPT: requests decoding together x prompt tokens of each",
    )
    p.add_argument("--steps", type=int, default=48, help="decode steps timed per engine")
    p.add_argument("--block", type=int, default=4, help="steps in a row of one engine")
    p.add_argument("--budget-mib", type=int, default=64, help="KV cache memory per engine")
    p.add_argument("--quick", action="store_true", help="4 requests, 16-token prompts")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.workloads, args.steps, args.block = ["4x16"], 4, 2
    try:
        args.workloads = [tuple(int(n) for n in w.split("x", 1)) for w in args.workloads]
    except ValueError:
        p.error("--workloads takes RUNNINGxPROMPT, e.g. 32x256")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    start = time.perf_counter()
    torch.set_num_threads(1)
    meas = machine.measure()
    results = {f"{r}x{n}": run(r, n, args) for r, n in args.workloads}
    lines = [
        header(
            "MLA against GQA: decode tok/s and KV bytes per token (`synthetic:dsv2-lite`)",
            ["python", "-m", "benchmarks.speed.mla_vs_gqa", *argv],
            time.perf_counter() - start,
            meas,
        ),
        f"- Commit: {machine.engine_revision()}",
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        f"{args.steps} decode steps per engine in blocks of {args.block}, KV budget "
        f"{args.budget_mib} MiB, block size {BLOCK_SIZE}, float32, 1 torch thread.",
    ]
    for (running, prompt), rows in zip(args.workloads, results.values(), strict=True):
        lines += ["", *render(running, prompt, rows, args)]
    publish(SECTION, "\n".join(lines), results_path(args))
    return results


if __name__ == "__main__":
    main()
