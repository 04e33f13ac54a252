"""Where `moescope serve` loses against the same engine offline, on the peer workload.

Each round runs the workload four ways, each in a fresh process: offline (`offline.py`:
the engine stepped on the main thread), through the engine loop (`offline.py --via
loop`: the thread `moescope serve` steps on, requests submitted in process, no HTTP), served
(`moescope serve` and the peer benchmark's HTTP client), and offline again (the A/A control).
So loop / offline is what the engine thread costs, serve / loop what HTTP and the client
cost. No llama.cpp is needed: the checkpoint is the peer benchmark's, built if missing.

`--before DIR` compares this checkout with another (a git worktree of an older commit, run
from its own tree): each round runs offline and serve of DIR, then of this checkout twice
(the A/A control); `--overlap` adds both arms again with the engine's overlapped steps.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import replace
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
    add_quiet_argument,
    cached_checkpoint,
    kv_blocks,
    moescope_args,
    moescope_run,
    offline_run,
    progress,
)
from benchmarks.speed.offline_runners import Workload, make_workload

ARMS = ("offline", "loop", "serve", "offline A/A")  # each round's order
BEFORE_ARMS = ("before offline", "before serve", "offline", "serve", "offline A/A", "serve A/A")
OVERLAP_ARMS = ("offline overlap", "serve overlap")  # with --overlap, after the others
TARGETS = {
    "serve_offline": Target("moescope serve / moescope offline, median output tok/s", 0.95),
    # issue 47: nothing regresses on the CPU (the A/A lines give the noise floor)
    "serve_before": Target("moescope serve, this checkout / --before's, median tok/s", 0.95),
    "offline_before": Target("moescope offline, this checkout / --before's, median tok/s", 0.95),
}


def arms(args: argparse.Namespace) -> tuple[str, ...]:
    chosen = BEFORE_ARMS if args.before else ARMS
    return chosen + (OVERLAP_ARMS if args.overlap else ())


def arm_run(ctx: OursContext, precision: str, arm: str, wl: Workload, before: Path | None) -> Run:
    """One arm: serve or offline (stepped, or via the loop), of `before`'s tree for the
    before arms, with overlapped steps for the overlap arms."""
    if arm.startswith("before"):
        assert before is not None
        ctx = replace(ctx, tree=before)
    overlap = arm.endswith("overlap")
    if "serve" in arm.split():
        run = moescope_run(ctx, precision, wl, ("--overlap",) if overlap else ())
    else:
        via = "loop" if arm == "loop" else "steps"
        run = offline_run(ctx, precision, via=via, overlap=overlap)
    run.engine = arm
    return run


def rounds(
    ctx: OursContext,
    precision: str,
    wl: Workload,
    n: int,
    order: tuple[str, ...],
    before: Path | None,
) -> list[Run]:
    runs = []
    for r in range(n):
        for arm in order:
            run = arm_run(ctx, precision, arm, wl, before)
            run.extra["round"] = r + 1
            run.extra["load"] = os.getloadavg()[0]  # the shared machine's, over the last minute
            runs.append(run)
            progress(f"round {r + 1} {arm}: {run.tok_s:.1f} tok/s ({run.wall_s:.2f} s)")
    return runs


def summarize(runs: list[Run]) -> dict[str, float]:
    """Median tok/s per arm and the ratios between them (median to median)."""
    names = dict.fromkeys(r.engine for r in runs)
    med = {a: statistics.median(r.tok_s for r in runs if r.engine == a) for a in names}
    out = {
        **med,
        "serve_offline": med["serve"] / med["offline"],
        "aa": med["offline A/A"] / med["offline"],
    }
    if "loop" in med:
        out |= {
            "loop_offline": med["loop"] / med["offline"],
            "serve_loop": med["serve"] / med["loop"],
        }
    if "before serve" in med:
        out |= {
            "before_serve_offline": med["before serve"] / med["before offline"],
            "aa_serve_offline": med["serve A/A"] / med["offline A/A"],
            "serve_before": med["serve"] / med["before serve"],
            "offline_before": med["offline"] / med["before offline"],
            "aa_serve": med["serve A/A"] / med["serve"],
        }
    if "serve overlap" in med:
        out |= {
            "overlap_offline": med["offline overlap"] / med["offline"],
            "overlap_serve": med["serve overlap"] / med["serve"],
        }
    return out


def per_round(runs: list[Run], num: str, den: str) -> list[float]:
    """`num` / `den` tok/s in each round."""
    by = {(r.extra["round"], r.engine): r.tok_s for r in runs}
    return [by[k, num] / by[k, den] for k, arm in by if arm == num]


def render(
    args: argparse.Namespace, argv: list[str], ctx: OursContext, wl: Workload, out: dict
) -> str:
    runs, s = out["runs"], out["summary"]
    command = ["python", "-m", "benchmarks.peer.serve_overhead", *argv]
    order = arms(args)
    quiet = f"after the machine is quiet (at most {ctx.quiet_s:.0f} s of waiting)"
    lines = [
        header(title(args), command, out["runtime_s"], out["machine"]),
        f"- Model: {args.model or ctx.shape.describe()}, seed {args.seed}; served at "
        f"{args.precision}",
        f"- moescope: engine {machine.engine_revision()}; `moescope serve --model DIR "
        f"{shlex.join(moescope_args(DTYPES[args.precision], ctx.kv_blocks, ctx.threads))}`",
        *([f"- before: {out['before']}"] if args.before else []),
        f"- {workload_line(wl, args.seed)}",
        f"- Arms, each round in this order, each a fresh process {quiet}: "
        f"{', '.join(order)}. offline: `offline.py` (the engine `moescope serve` runs, "
        f"with its flags, stepped on the main thread); loop: `offline.py --via loop` "
        f"(an engine loop on its own thread, as the server's, requests submitted in process); "
        f"serve: `moescope serve` driven by the peer benchmark's client (one async aiohttp "
        f"client in this process; client CPU s is its CPU); before: the same, of the "
        f"`--before` checkout; overlap: with `--overlap`. s in steps: the engine's time "
        f"inside its steps.",
        "",
        "| round | arm | wall s | out tok/s | CPU s | client CPU s | others' CPU s | steps, s in "
        "steps | load, 1 min |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        steps = f"{r.extra.get('steps', '-')}, {r.extra.get('busy_s', 0.0):.2f}"
        client = f"{r.extra['client_cpu_s']:.2f}" if "client_cpu_s" in r.extra else "-"
        lines.append(
            f"| {r.extra['round']} | {r.engine} | {r.wall_s:.2f} | {r.tok_s:.1f} | "
            f"{r.cpu_s:.1f} | {client} | {r.others_cpu_s:.1f} | {steps} | "
            f"{r.extra['load']:.1f} |"
        )
    medians = ", ".join(f"{a} {s[a]:.1f}" for a in order)
    rounds_text = ", ".join(f"{x:.3f}" for x in per_round(runs, "serve", "offline"))
    lines += ["", f"Medians: {medians} out tok/s. Ratios, median to median: {ratios(s)}."]
    lines += [f"serve / offline in each round: {rounds_text}.", "", "Targets:", ""]
    lines += [TARGETS[k].line(s[k], f"{s[k]:.3f}") for k in TARGETS if k in s]
    return "\n".join(lines)


def ratios(s: dict[str, float]) -> str:
    """The summary's ratios in words (those its arms have)."""
    words = {
        "loop_offline": "loop / offline (the engine thread)",
        "serve_loop": "serve / loop (HTTP and the client)",
        "serve_offline": "serve / offline",
        "before_serve_offline": "before serve / before offline",
        "aa_serve_offline": "serve A/A / offline A/A",
        "serve_before": "serve / before serve",
        "offline_before": "offline / before offline",
        "overlap_serve": "serve overlap / serve",
        "overlap_offline": "offline overlap / offline",
        "aa": "A/A: offline A/A / offline",
        "aa_serve": "serve A/A / serve",
    }
    return ", ".join(f"{w} **{s[k]:.3f}**" for k, w in words.items() if k in s)


def describe_tree(tree: Path) -> str:
    """`tree`'s commit, in words (a git worktree of an older commit, say)."""
    done = subprocess.run(
        ["git", "-C", str(tree), "log", "-1", "--format=commit %h (%cd): %s", "--date=short"],
        capture_output=True,
        text=True,
        check=True,
    )
    return f"{tree}, {done.stdout.strip()}"


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
        "--before",
        type=Path,
        help="another checkout (a git worktree of an older commit) to run side by side",
    )
    p.add_argument("--overlap", action="store_true", help="offline and serve with --overlap too")
    p.add_argument(
        "--quick", action="store_true", help="16 requests, 1 round, no waiting for quiet"
    )
    add_quiet_argument(p)
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.repeats, args.quiet_wait = 16, 1, 0.0
    if args.before:
        args.before = args.before.resolve()
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
        shape, model, kv_blocks(wl), args.threads, len(wl), args.seed, args.quiet_wait
    )
    started, measured = time.perf_counter(), machine.measure()
    runs = rounds(ctx, args.precision, wl, args.repeats, arms(args), args.before)
    out: dict[str, Any] = {"runs": runs, "summary": summarize(runs), "machine": measured}
    if args.before:
        out["before"] = describe_tree(args.before)
    out["runtime_s"] = time.perf_counter() - started
    threads = "" if args.threads == 2 else f"_t{args.threads}"
    section = f"serve_overhead_{args.shape}_{args.precision}{threads}"
    publish(section, render(args, argv, ctx, wl, out), results_path(args))
    return out


if __name__ == "__main__":
    main()
