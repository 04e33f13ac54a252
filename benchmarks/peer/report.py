"""The Markdown section of `llamacpp.py`: setup, agreement, sweep, every run, medians."""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING, Any

from benchmarks.harness import machine
from benchmarks.harness.results_md import header
from benchmarks.harness.targets import Target
from benchmarks.peer import build as peer_build
from benchmarks.peer.runs import QUIET_CORES, moescope_args

if TYPE_CHECKING:
    from benchmarks.peer.runs import Context, Run
    from benchmarks.speed.offline_runners import Workload

# issue 17: 1.15x llama.cpp on its model; on fine-grained experts, stay ahead
PEER_TARGET = {"serve": 1.15, "fine": 1.0}
OFFLINE = Target("moescope serve / moescope offline, median output tok/s", 0.95)


def section(precision: str, shape: str) -> str:
    """The RESULTS.md section of one precision and shape (each has its own run and command)."""
    return f"peer_llamacpp_{precision}" + ("" if shape == "serve" else f"_{shape}")


def render(
    args: argparse.Namespace,
    argv: list[str],
    ctx: Context,
    wl: Workload,
    precision: str,
    res: dict[str, Any],
) -> str:
    command = ["python", "-m", "benchmarks.peer.llamacpp", *argv]
    experts = "" if args.shape == "serve" else ", fine-grained experts"
    title = (
        f"moescope serve vs llama.cpp llama-server, {precision}{experts} "
        "(`benchmarks/peer/llamacpp.py`)"
    )
    peer = Target(
        f"moescope serve / llama-server best, median output tok/s ({precision}{experts})",
        PEER_TARGET[args.shape],
    )
    ratio, offline = res["summary"]["ratio"], res["summary"]["offline_ratio"]
    return "\n".join(
        [
            header(title, command, res["runtime_s"], machine.measure()),
            *setup(args, ctx, wl),
            "",
            *agreement_lines(res["agreement"], precision),
            *sweep_lines(res["sweep"], res["best"]),
            *run_lines(res["runs"], res["summary"]),
            "",
            "Targets:",
            "",
            peer.line(ratio, f"{ratio:.3f}"),
            OFFLINE.line(offline, f"{offline:.3f}"),
        ]
    )


def setup(args: argparse.Namespace, ctx: Context, wl: Workload) -> list[str]:
    """The bullets after the header: both engines, how they were built and run, the model,
    the workload and the method."""
    src = ctx.source
    dtype = "float32|bfloat16"
    return [
        f"- llama.cpp: `{src.sdist}` from PyPI (sha256 {src.sha256[:16]}...; an sdist has no "
        f"git history, so llama-server reports `{peer_build.server_version(src)}`), "
        f"`llama-server` built with `cmake {' '.join(peer_build.CMAKE_FLAGS)}` in "
        f"{ctx.bins.parent}; GGUF from its `convert_hf_to_gguf.py --outtype f32|bf16`, "
        "given a minimal Llama-style tokenizer.json of the checkpoint's vocab size in a copy of "
        "the checkpoint (prompts are token ids)",
        f"- llama-server flags: `-np N -c N*{ctx.slot_ctx} -t T -tb T -ub U -b max(2048,U) "
        "-fa F -ctk K -ctv K --cache-ram 0` (each slot holds the longest request; K is the "
        "section's precision, so the KV cache is f32 or bf16 like moescope's); N, T, U and F "
        "from the sweep",
        f"- moescope: engine {machine.engine_revision()}; `moescope serve --model DIR "
        f"{shlex.join(moescope_args(dtype, ctx.kv_blocks, ctx.threads))}` (the KV blocks hold "
        "every request at once; metrics and recording off, as llama-server's metrics are "
        "by default)",
        f"- Model: {ctx.shape.describe()}, seed {args.seed}; served at the section's precision",
        f"- {workload_line(wl, args.seed)} (llama.cpp's `ignore_eos` also bans its EOS id 2; "
        "the checkpoint has none)",
        "- Method: one async aiohttp client in the benchmark process drives both (llama-server "
        "`/completion` with `cache_prompt: false`, moescope `/v1/completions`); every reply "
        "must hold exactly its requested token count; out tok/s = output tokens / wall time "
        "from the first send to the last reply. Each run is a fresh server subprocess, "
        "waited on until its health endpoint answers, warmed up with two short requests, then "
        "stopped. Server CPU s is the server process's user + system time over the run. "
        "Rounds alternate llama.cpp, moescope, moescope offline, moescope again (A/A "
        "control). moescope offline is the engine `moescope serve` runs, with its flags, "
        "driven in process in a fresh process (`benchmarks/peer/offline.py`: every request "
        "added at once, stepped until done, after the same warm-up); its CPU s is that "
        "process's over the run. The cores are "
        "shared with other workers, so each server starts only once other processes have used "
        f"under {QUIET_CORES} cores for 2 s (or after {ctx.quiet_s:.0f} s of waiting); "
        "others' CPU s is the CPU time every other process took during the run (the "
        "machine's busy time from /proc/stat ticks less the server's and the client's own "
        "times, so good to a few CPU seconds; a negative difference shows as 0): runs with "
        "others' CPU well above zero were disturbed",
        f"- Preparation (llama.cpp build, checkpoint, GGUF conversion; skipped when cached "
        f"under {peer_build.CACHE}): {args.prepare_s:.0f} s this time",
    ]


def workload_line(wl: Workload, seed: int) -> str:
    return (
        f"Workload: {len(wl)} requests arriving at once, seed {seed}, prompt lengths "
        f"log-uniform 16..512 ({wl.num_prompt_tokens} tokens), output lengths log-uniform "
        f"8..245 ({wl.num_output_tokens} tokens), token-id prompts, greedy, EOS ignored"
    )


def agreement_lines(rows: list[dict[str, Any]], precision: str) -> list[str]:
    """How many leading greedy tokens agree, per prompt (below f32, each engine against
    moescope at f32 too: how far this precision alone moves greedy decoding)."""
    lines = [
        f"Agreement before timing: leading greedy tokens (of {rows[0]['of']}) equal between "
        f"llama-server (`-np 4 -fa off`, KV cache {precision}) and moescope's engine (the one "
        "`moescope serve` runs, in process: the server's replies carry text), for the "
        "workload's first prompts.",
        "",
    ]
    if precision == "f32":
        lines += ["| prompt tokens | llama.cpp = moescope |", "| --- | --- |"]
        lines += [f"| {r['prompt']} | {r['same']} |" for r in rows]
    else:
        lines += [
            f"| prompt tokens | llama.cpp = moescope ({precision}) | llama.cpp {precision} = "
            f"moescope f32 | moescope {precision} = moescope f32 |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {r['prompt']} | {r['same']} | {r['llama_vs_f32']} | {r['moescope_vs_f32']} |"
            for r in rows
        ]
        lines += [
            "",
            f"At {precision} neither engine reproduces f32's greedy tokens for long, so the "
            "two need not agree with each other: ggml rounds only a matmul's input to "
            f"{precision} and keeps its result, the norms and the residual stream in f32, "
            f"while moescope's torch model at {precision} passes activations between ops in "
            f"{precision}.",
        ]
    return [*lines, ""]


def sweep_lines(tried: list[Run], best: Any) -> list[str]:
    if not tried:
        return [f"llama.cpp setting: `{best}` (no sweep).", ""]
    lines = [
        f"llama.cpp sweep on the whole workload (coordinate search: `-np` 16 to 128, halved "
        f"further while the smallest is fastest, then `-t`, `-ub`, `-fa`, each stage keeping "
        f"the fastest; one run each). Best: `{best}`.",
        "",
        "| llama-server setting | wall s | out tok/s | server CPU s | others' CPU s |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| `{r.setting}` | {r.wall_s:.1f} | {r.tok_s:.1f} | {r.cpu_s:.1f} | {r.others_cpu_s:.1f} |"
        for r in tried
    ]
    return [*lines, ""]


def run_lines(runs: list[Run], summary: dict[str, float]) -> list[str]:
    lines = [
        "| round | server | wall s | out tok/s | server CPU s | out tok per server CPU s | "
        "others' CPU s | moescope engine steps, s in steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r.extra['round']} | {r.engine} | {r.wall_s:.1f} | {r.tok_s:.1f} | {r.cpu_s:.1f} | "
        f"{r.tokens / r.cpu_s:.1f} | {r.others_cpu_s:.1f} | {_loop_cell(r)} |"
        for r in runs
    ]
    engines = dict.fromkeys(r.engine for r in runs)
    spread = "; ".join(_spread(runs, e) for e in engines)
    return [
        *lines,
        "",
        f"Medians: llama.cpp {summary['llama.cpp']:.1f}, moescope {summary['moescope']:.1f}, "
        f"moescope offline {summary['moescope offline']:.1f}, moescope A/A "
        f"{summary['moescope A/A']:.1f} out tok/s. Ratio moescope / llama.cpp (median to "
        f"median): **{summary['ratio']:.3f}**; moescope serve / offline: "
        f"**{summary['offline_ratio']:.3f}**; A/A (second moescope run / first, medians): "
        f"{summary['aa']:.3f}. Spread across rounds (fastest / slowest run): "
        f"{spread}.",
    ]


def _loop_cell(run: Run) -> str:
    if "steps" not in run.extra:
        return "-"
    return f"{run.extra['steps']}, {run.extra['busy_s']:.1f}"


def _spread(runs: list[Run], engine: str) -> str:
    tps = [r.tok_s for r in runs if r.engine == engine]
    return f"{engine} {max(tps) / min(tps):.3f}"
