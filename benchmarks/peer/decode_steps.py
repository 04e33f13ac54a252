"""Where the peer workload's time goes: decode step time by batch size, moescope against
llama.cpp, and how many of the workload's steps run at each batch size.

1. Batched decode on issue 17's model (the peer benchmark's checkpoint and GGUFs, cached by
   `llamacpp.py`), f32 and bf16, 2 threads: B sequences of a `--prompt`-token prompt
   generate `--tokens` tokens together. llama.cpp: its `llama-batched-bench` (`-fa off`, the
   KV cache at the precision), ms per decode step = its generation seconds / tokens.
   moescope: its engine with the B requests added at once, ms per decode step = the median
   wall time of `LLMEngine.step` over the steps where all B decode (scheduling, the forward,
   sampling and the outputs included, as llama.cpp's figure includes its own).
2. The peer workload (128 requests at once, prompts 16-512, outputs 8-245) through moescope's
   engine offline in f32: its steps grouped by how many sequences run, with their count, their
   median ms and their share of the run's wall time, beside llama.cpp's ms per decode step at
   that batch (interpolated in B). All requests arrive at once, so the run ends with a tail of
   ever fewer long requests, each step still a whole pass over the weights.

Writes its section of benchmarks/RESULTS.md.

    python -m benchmarks.peer.decode_steps       # --quick: a tiny model, moescope only, no file
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.peer import build as peer_build
from benchmarks.peer.runs import OUTPUT_RANGE, PROMPT_RANGE, cached_checkpoint
from benchmarks.speed.offline_runners import (
    QUICK_SHAPE,
    SERVE_SHAPE,
    Shape,
    build_checkpoint,
    make_workload,
    ours_decode_ms,
    progress,
    timed_steps,
    warm_ours,
)
from engine import LLMEngine, SamplingParams

SECTION = "decode_steps"
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
PRECISIONS = {"f32": "float32", "bf16": "bfloat16"}
BUCKETS = ((1, 4), (5, 16), (17, 32), (33, 64), (65, 128))  # running sequences, inclusive


def engine_for(model: Path, dtype: str, threads: int, blocks: int) -> LLMEngine:
    engine = LLMEngine(
        model=str(model), dtype=dtype, max_num_seqs=128, num_kv_blocks=blocks, threads=threads
    )
    warm_ours(engine, engine.model_config.vocab_size)
    return engine


def llama_decode_ms(gguf: Path, kv: str, args: argparse.Namespace) -> dict[int, float]:
    """llama-batched-bench's ms per decode step for each of BATCHES."""
    bins = peer_build.build(peer_build.fetch_source())
    ctx = max(BATCHES) * (args.prompt + args.tokens) + 256
    cmd = [str(bins / "llama-batched-bench"), "-m", str(gguf), "-c", str(ctx), "-b", "2048"]
    cmd += ["-ub", "512", "-npp", str(args.prompt), "-ntg", str(args.tokens)]
    cmd += ["-npl", ",".join(map(str, BATCHES)), "-t", str(args.threads), "-tb", str(args.threads)]
    cmd += ["-ctk", kv, "-ctv", kv, "-fa", "off"]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return parse_batched_bench(text, args.tokens)


def parse_batched_bench(text: str, tokens: int) -> dict[int, float]:
    """From the table rows `| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | ...`: B -> ms
    per decode step."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and all(re.fullmatch(r"[\d.]+", c) for c in cells[:8]):
            out[int(cells[2])] = float(cells[6]) * 1000 / tokens
    return out


def workload_steps(model: Path, shape: Shape, args: argparse.Namespace) -> dict[str, Any]:
    """The peer workload offline in f32: per step its ms, running sequences, prefill tokens."""
    wl = make_workload(args.requests, 0, shape.vocab, PROMPT_RANGE, OUTPUT_RANGE)
    engine = engine_for(model, "float32", args.threads, wl.blocks(16) + 128)
    for p, n in zip(wl.prompts, wl.max_tokens, strict=True):
        engine.add_request(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    t0 = time.perf_counter()
    steps = timed_steps(engine)
    return {"steps": steps, "wall_s": time.perf_counter() - t0, "tokens": wl.num_output_tokens}


def measure(args: argparse.Namespace, model: Path, shape: Shape) -> dict[str, Any]:
    ours: dict[str, dict[int, float]] = {}
    theirs: dict[str, dict[int, float]] = {}
    blocks = max(args.batches) * -(-(args.prompt + args.tokens) // 16) + 64
    for name, dtype in PRECISIONS.items():
        engine = engine_for(model, dtype, args.threads, blocks)
        ours[name] = {b: ours_decode_ms(engine, b, args.prompt, args.tokens) for b in args.batches}
        progress(f"moescope {name}: {ours[name]}")
        gguf = model.with_name(f"{model.name}-{name}.gguf")
        if not args.quick and gguf.exists():
            theirs[name] = llama_decode_ms(gguf, name, args)
            progress(f"llama.cpp {name}: {theirs[name]}")
    return {"ours": ours, "theirs": theirs, "workload": workload_steps(model, shape, args)}


def bucket_rows(run: dict[str, Any], llama: dict[int, float] | None) -> list[str]:
    """One row per BUCKETS range that has steps."""
    steps, wall_ms = run["steps"], run["wall_s"] * 1000
    rows = []
    for lo, hi in BUCKETS:
        group = [(ms, n, pre) for ms, n, pre in steps if lo <= n <= hi]
        if not group:
            continue
        decodes = [ms for ms, _, pre in group if pre == 0]
        ours = f"{statistics.median(decodes):.1f}" if decodes else "-"
        theirs = "-"
        if llama and decodes:
            batches = sorted(llama)
            at = [float(np.interp(n, batches, [llama[b] for b in batches])) for _, n, _ in group]
            theirs = f"{statistics.median(at):.1f}"
        rows.append(
            f"| {lo}-{hi} | {len(group)} | {len(group) - len(decodes)} | "
            f"{statistics.median(ms for ms, _, _ in group):.1f} | {ours} | {theirs} | "
            f"{100 * sum(ms for ms, _, _ in group) / wall_ms:.0f}% |"
        )
    return rows


def render(args: argparse.Namespace, argv: list[str], out: dict[str, Any], total_s: float) -> str:
    command = ["python", "-m", "benchmarks.peer.decode_steps", *argv]
    lines = [
        header(
            "Where the peer workload's time goes (`benchmarks/peer/decode_steps.py`)",
            command,
            total_s,
            machine.measure(),
        ),
        f"- Model: {out['shape'].describe()}, seed 0 (the peer benchmark's checkpoint and "
        f"GGUFs); {args.threads} threads each; batched decode: prompts of {args.prompt} "
        f"tokens, {args.tokens} generated; llama.cpp `llama-batched-bench -b 2048 -ub 512 "
        "-fa off -ctk K -ctv K` at the precision (its generation seconds / tokens); moescope: "
        "the median wall time of `LLMEngine.step` over the steps in which all B sequences "
        "decode",
        "",
        "| batch | "
        + " | ".join(
            f"llama.cpp {p} ms | moescope {p} ms | moescope / llama.cpp {p}" for p in PRECISIONS
        )
        + " |",
        "| --- " * (1 + 3 * len(PRECISIONS)) + "|",
    ]
    for b in args.batches:
        cells = []
        for p in PRECISIONS:
            ours, theirs = out["ours"][p][b], out["theirs"].get(p, {}).get(b)
            cells += (
                [f"{theirs:.1f}", f"{ours:.1f}", f"{ours / theirs:.2f}"]
                if theirs
                else ["-", f"{ours:.1f}", "-"]
            )
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    run = out["workload"]
    lines += [
        "",
        f"The peer workload ({args.requests} requests at once) through moescope's engine "
        f"offline, f32: {len(run['steps'])} steps in {run['wall_s']:.1f} s, "
        f"{run['tokens'] / run['wall_s']:.0f} out tok/s. Its steps by running sequences "
        "(llama.cpp's decode step ms interpolated at each step's batch, median):",
        "",
        "| running sequences | steps | of which carry prefill | median ms | median ms, "
        "decode only | llama.cpp decode ms at that batch | share of the wall time |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *bucket_rows(run, out["theirs"].get("f32")),
    ]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a tiny model, batches 1 and 4")
    add_results_arguments(p)
    args = p.parse_args(argv)
    args.batches = BATCHES
    if args.quick:
        args.batches, args.prompt, args.tokens, args.requests = (1, 4), 8, 4, 6
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            shape = replace(QUICK_SHAPE, max_positions=1024)  # room for the peer workload
            model = build_checkpoint(Path(tmp) / "model", shape, 0)
        else:
            shape = SERVE_SHAPE
            model = cached_checkpoint(shape, 0)
        out = measure(args, model, shape)
    out["shape"] = shape
    publish(SECTION, render(args, argv, out, time.perf_counter() - started), results_path(args))
    return out


if __name__ == "__main__":
    main()
