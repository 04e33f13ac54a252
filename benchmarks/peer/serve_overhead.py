"""Where `moescope serve` loses against the same engine offline, on the peer workload.

Each round runs the workload four ways, each in a fresh process: offline (`offline.py`:
the engine stepped on the main thread), through the engine loop (`offline.py --via
loop`: the thread `moescope serve` steps on, requests submitted in process, no HTTP), served
(`moescope serve` and the peer benchmark's HTTP client), and offline again (the A/A control).
So loop / offline is what the engine thread costs, serve / loop what HTTP and the client
cost. No llama.cpp is needed: the checkpoint is the peer benchmark's, built if missing.
"""

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.harness.targets import Target
from benchmarks.peer.report import workload_line
from benchmarks.peer.runs import (
    DTYPES,
    OUTPUT_RANGE,
    PROMPT_RANGE,
    SHAPES,
    OursContext,
    Run,
    cached_checkpoint,
    kv_blocks,
    moescope_args,
    moescope_run,
    offline_run,
    progress,
)
from benchmarks.speed.offline_runners import Workload, make_workload

ARMS = ("offline", "loop", "serve", "offline A/A")  # each round's order
TARGETS = {
    "serve_offline": Target("moescope serve / moescope offline, median output tok/s", 0.95),
}


def arm_run(ctx: OursContext, precision: str, arm: str, wl: Workload) -> Run:
    if arm == "serve":
        run = moescope_run(ctx, precision, wl)
    else:
        run = offline_run(ctx, precision, via="loop" if arm == "loop" else "steps")
    run.engine = arm
    return run


def rounds(ctx: OursContext, precision: str, wl: Workload, n: int) -> list[Run]:
    runs = []
    for r in range(n):
        for arm in ARMS:
            run = arm_run(ctx, precision, arm, wl)
            run.extra["round"] = r + 1
            runs.append(run)
            progress(f"round {r + 1} {arm}: {run.tok_s:.1f} tok/s ({run.wall_s:.2f} s)")
    return runs


def summarize(runs: list[Run]) -> dict[str, float]:
    """Median tok/s per arm and the ratios between them (median to median)."""
    med = {a: statistics.median(r.tok_s for r in runs if r.engine == a) for a in ARMS}
    return {
        **med,
        "loop_offline": med["loop"] / med["offline"],
        "serve_loop": med["serve"] / med["loop"],
        "serve_offline": med["serve"] / med["offline"],
        "aa": med["offline A/A"] / med["offline"],
    }


def per_round(runs: list[Run], num: str, den: str) -> list[float]:
    """`num` / `den` tok/s in each round."""
    by = {(r.extra["round"], r.engine): r.tok_s for r in runs}
    return [by[k, num] / by[k, den] for k, arm in by if arm == num]


def render(
    args: argparse.Namespace, argv: list[str], ctx: OursContext, wl: Workload, out: dict
) -> str:
    runs, s = out["runs"], out["summary"]
    command = ["python", "-m", "benchmarks.peer.serve_overhead", *argv]
    lines = [
        header(title(args), command, out["runtime_s"], out["machine"]),
        f"- Model: {args.model or ctx.shape.describe()}, seed {args.seed}; served at "
        f"{args.precision}",
        f"- moescope: engine {machine.engine_revision()}; `moescope serve --model DIR "
        f"{shlex.join(moescope_args(DTYPES[args.precision], ctx.kv_blocks, ctx.threads))}`",
        f"- {workload_line(wl, args.seed)}",
        f"- Arms, each round in this order, each a fresh process after the machine is quiet: "
        f"{', '.join(ARMS)}. offline: `offline.py` (the engine `moescope serve` runs, "
        f"with its flags, stepped on the main thread); loop: `offline.py --via loop` "
        f"(an engine loop on its own thread, as the server's, requests submitted in process); "
        f"serve: `moescope serve` driven by the peer benchmark's client (one async aiohttp "
        f"client in this process; client CPU s is its CPU). s in steps: the engine's time "
        f"inside its steps.",
        "",
        "| round | arm | wall s | out tok/s | CPU s | client CPU s | others' CPU s | steps, s in "
        "steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        steps = f"{r.extra.get('steps', '-')}, {r.extra.get('busy_s', 0.0):.2f}"
        client = f"{r.extra['client_cpu_s']:.2f}" if "client_cpu_s" in r.extra else "-"
        lines.append(
            f"| {r.extra['round']} | {r.engine} | {r.wall_s:.2f} | {r.tok_s:.1f} | "
            f"{r.cpu_s:.1f} | {client} | {r.others_cpu_s:.1f} | {steps} |"
        )
    medians = ", ".join(f"{a} {s[a]:.1f}" for a in ARMS)
    rounds_text = ", ".join(f"{x:.3f}" for x in per_round(runs, "serve", "offline"))
    lines += [
        "",
        f"Medians: {medians} out tok/s. Ratios, median to median: loop / offline "
        f"**{s['loop_offline']:.3f}** (the engine thread), serve / loop "
        f"**{s['serve_loop']:.3f}** (HTTP and the client), serve / offline "
        f"**{s['serve_offline']:.3f}**; A/A (offline again / offline) {s['aa']:.3f}. "
        f"serve / offline in each round: {rounds_text}.",
        "",
        "Targets:",
        "",
        TARGETS["serve_offline"].line(s["serve_offline"], f"{s['serve_offline']:.3f}"),
    ]
    return "\n".join(lines)


def title(args: argparse.Namespace) -> str:
    shape = ", fine-grained experts" if args.shape == "fine" else ""
    return (
        f"moescope serve against offline, {args.precision}{shape}, {args.threads} thread(s) "
        "(`benchmarks/peer/serve_overhead.py`)"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=list(DTYPES), default="bf16")
    p.add_argument("--shape", choices=list(SHAPES), default="serve", help="the model's MoE shape")
    p.add_argument("--repeats", type=int, default=8, help="rounds of the four arms")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", type=Path, help="a checkpoint of --shape (default: the peer's)")
    p.add_argument(
        "--quick", action="store_true", help="16 requests, 1 round, no waiting for quiet"
    )
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.repeats = 16, 1
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The rounds and their medians, published as this shape and precision's section."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    shape = SHAPES[args.shape]
    model = args.model or cached_checkpoint(shape, args.seed)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    wl = make_workload(args.requests, args.seed, vocab, PROMPT_RANGE, OUTPUT_RANGE)
    ctx = OursContext(
        shape, model, kv_blocks(wl), args.threads, len(wl), args.seed, quiet=not args.quick
    )
    started, measured = time.perf_counter(), machine.measure()
    runs = rounds(ctx, args.precision, wl, args.repeats)
    out = {"runs": runs, "summary": summarize(runs), "machine": measured}
    out["runtime_s"] = time.perf_counter() - started
    threads = "" if args.threads == 2 else f"_t{args.threads}"
    section = f"serve_overhead_{args.shape}_{args.precision}{threads}"
    publish(section, render(args, argv, ctx, wl, out), results_path(args))
    return out


if __name__ == "__main__":
    main()
