"""Offline throughput: moescope vs `transformers` on one seeded workload, back to back.

All requests arrive at once. Four runs on the same Mixtral-shaped checkpoint
(offline_runners.py has the runners):

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
benchmarks/RESULTS.md. Run: `python -m benchmarks.speed.offline_throughput` (`--quick` for a
smoke run).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import machine
from benchmarks.harness.results_md import (
    add_results_arguments,
    header,
    percentiles_cell,
    publish,
    results_path,
)
from benchmarks.harness.targets import Target
from benchmarks.speed.offline_runners import (
    FULL_SHAPE,
    QUICK_SHAPE,
    CBConfig,
    RunResult,
    Shape,
    Workload,
    build_checkpoint,
    load_hf,
    make_workload,
    parse_grid,
    phase_hf_static,
    phase_ours,
    progress,
    quiet_transformers,
    run_hf_cb,
    tune_hf_cb,
)
from stats import summary

SECTION = "offline_throughput"
TARGETS = {  # key of the other run (or the bound): the goal for ours against it
    "hf_cb": Target("ours vs transformers' best continuous batching (tok/s ratio)", 1.8),
    "hf_static": Target("ours vs transformers static generate (tok/s ratio)", 4.0),
    "ours_static": Target("our continuous vs our static (tok/s ratio)", 2.0),
    "forward_bound": Target(
        "our wall time vs forward-only bound (ratio)", 1.15, higher_is_better=False
    ),
}


# ---------------------------------------------------------------- targets


def check_targets(by_key: dict[str, RunResult]) -> dict[str, dict[str, Any]]:
    """Each TARGETS entry whose runs ran: its value (and on CPU time), and whether it is met."""
    ours = by_key["ours"]
    out = {}
    for key, target in TARGETS.items():
        if key == "forward_bound":
            value, cpu = ours.wall_s / ours.extra["dur_s"]["forward"], None
        elif key in by_key:
            value = ours.tok_per_s / by_key[key].tok_per_s
            cpu = ours.tok_per_cpu_s / by_key[key].tok_per_cpu_s
        else:
            continue
        out[key] = {"value": value, "cpu_value": cpu, "met": target.met(value)}
    return out


def target_lines(checks: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for key, c in checks.items():
        cpu = "" if c["cpu_value"] is None else f"; on CPU time {c['cpu_value']:.2f}x"
        lines.append(TARGETS[key].line(c["value"], f"{c['value']:.2f}x{cpu}"))
    return lines


# ---------------------------------------------------------------- report


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of requests whose greedy tokens are identical."""
    return sum(x == y for x, y in zip(a, b, strict=True)) / max(len(a), 1)


def render_table(results: list[RunResult], ref: RunResult) -> str:
    columns = (
        "| run | config | wall s | out tok/s | TTFT ms p50 / p90 / p99 "
        "| TPOT ms p50 / p90 / p99 | agreement with ours | ours speedup "
        "| CPU s | ours speedup on CPU time |"
    )
    lines = [columns, "|" + " --- |" * 10]
    for r in results:
        ttft = percentiles_cell(summary(v * 1000 for v in r.ttft_s), 0)
        tp = percentiles_cell(summary(v * 1000 for v in r.tpot_s), 1)
        speedup = ref.tok_per_s / r.tok_per_s
        cpu_speedup = ref.tok_per_cpu_s / r.tok_per_cpu_s
        lines.append(
            f"| {r.name} | {r.config} | {r.wall_s:.1f} | {r.tok_per_s:.1f} | {ttft} "
            f"| {tp} | {agreement(r.tokens, ref.tokens):.0%} | {speedup:.2f}x "
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


def describe_run(args: argparse.Namespace, shape: Shape, wl: Workload) -> list[str]:
    """The bullets after the header: software, engine code, model, workload, definitions."""
    import transformers

    return [
        f"- Software: transformers {transformers.__version__}; every run with {args.threads} "
        "torch intra-op thread(s). The machine is shared (other workers run tests at the same "
        "time), so absolute numbers are noisy; the ratios come from runs side by side in one "
        "process",
        f"- Engine code: {machine.engine_revision()}",
        f"- Model: {shape.describe()}",
        f"- Workload: {len(wl)} requests arriving at once, seed {args.seed}, prompt lengths "
        f"log-uniform {args.prompt_range[0]}..{args.prompt_range[1]} "
        f"({wl.num_prompt_tokens} tokens), output lengths log-uniform "
        f"{args.output_range[0]}..{args.output_range[1]} ({wl.num_output_tokens} tokens), "
        "greedy, EOS ignored",
        "- TTFT counts from the moment all requests arrive (so it includes queueing); TPOT is "
        "each request's mean time per token after its first (`stats.tpot`); percentiles are "
        "`stats.percentile`. Agreement: share of requests whose greedy tokens equal ours "
        "(continuous). Speedup: our continuous tok/s over the row's.",
    ]


def render_section(
    args: argparse.Namespace,
    argv: list[str],
    shape: Shape,
    wl: Workload,
    report: dict[str, Any],
    runtime_s: float,
) -> str:
    by_key = report["runs"]
    ours = by_key["ours"]
    ours_runs = [r for k, r in by_key.items() if k in ("ours", "ours_static")]
    forward = ours.extra["dur_s"]["forward"]
    command = ["python", "-m", "benchmarks.speed.offline_throughput", *argv]
    parts = [
        header(
            "Offline throughput (`benchmarks/speed/offline_throughput.py`)",
            command,
            runtime_s,
            machine.measure(),
        ),
        *describe_run(args, shape, wl),
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
    if report["sweep"]:
        parts += [render_sweep(report["sweep"], min(args.cb_tune_requests, len(wl))), ""]
    parts += ["Targets:", "", *target_lines(report["targets"])]
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
    add_results_arguments(p)
    p.add_argument(
        "--profile", type=Path, default=None, help="write cProfile stats of our continuous run here"
    )
    return with_quick_defaults(p.parse_args(argv))


def with_quick_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options whose default depends on --quick."""
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
    return args


Phase = tuple[str, str, Callable[[], RunResult]]  # key, label, one timed run


def our_phases(args: argparse.Namespace, path: Path, wl: Workload) -> list[Phase]:
    """Ours continuous, and static unless skipped."""
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
    return phases


def hf_cb_phase(
    args: argparse.Namespace, path: Path, wl: Workload, sweep: list[tuple[CBConfig, float]]
) -> Phase:
    """transformers' continuous batching at its best grid point, tuned here (the sweep's
    points go to `sweep`)."""
    progress("tuning transformers continuous batching ...")
    with quiet_transformers():
        model = load_hf(path)
        best, points = tune_hf_cb(model, wl, args.cb_grid, args.cb_tune_requests, args.cb_page_size)
    sweep.extend(points)
    progress(f"tuning done: {best}")

    def cb() -> RunResult:
        result = run_hf_cb(model, wl, best, args.cb_page_size)
        result.config = f"{best}, page_size={args.cb_page_size} (best of {len(args.cb_grid)})"
        return result

    return ("hf_cb", "transformers continuous batching", cb)


def make_phases(
    args: argparse.Namespace, path: Path, wl: Workload, sweep: list[tuple[CBConfig, float]]
) -> list[Phase]:
    """The runs to time, in order; transformers' CB is tuned here, before any timed round."""
    phases = our_phases(args, path, wl)
    if not args.skip_hf_static:
        phases.append(
            (
                "hf_static",
                "transformers generate (static)",
                lambda: phase_hf_static(path, wl, args.static_batch),
            )
        )
    if not args.skip_hf_cb:
        phases.append(hf_cb_phase(args, path, wl, sweep))
    return phases


def run_phase(key: str, label: str, fn: Callable[[], RunResult], tag: str) -> RunResult:
    progress(f"{tag} {label} ...")
    with quiet_transformers() if key.startswith("hf") else contextlib.nullcontext():
        result = fn()
    progress(
        f"{tag} {label}: {result.num_tokens} tokens in {result.wall_s:.1f} s = "
        f"{result.tok_per_s:.1f} tok/s ({result.cpu_s:.1f} s CPU)"
    )
    return result


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
            runs[key].append(run_phase(key, label, fn, tag))
    by_key = {}
    for key, results in runs.items():
        best = min(results, key=lambda r: r.wall_s)
        best.extra["walls"] = [r.wall_s for r in results]
        by_key[key] = best
    return by_key, sweep


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark and publish its section; returns its runs (by key: `ours`,
    `ours_static`, `hf_static`, `hf_cb`), the transformers CB sweep and the targets."""
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
    report = {"runs": by_key, "sweep": sweep, "targets": check_targets(by_key)}
    section = render_section(args, argv, shape, wl, report, time.perf_counter() - started)
    publish(SECTION, section, results_path(args))
    return report


if __name__ == "__main__":
    main()
