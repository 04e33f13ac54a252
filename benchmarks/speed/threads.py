"""Thread counts on a shared machine: offline throughput at 1, 2 and `auto` engine threads,
with the machine quiet and with a busy-loop process pinned to one core.

The workload is the first 64 of issue 17's 128 requests (prompts log-uniform 16-512 tokens,
outputs 8-245, greedy, all arriving at once) on its model, run by `LLMEngine` to the end.
Every (condition, threads) pair runs once per round on a fresh engine, in rotating order
within its condition; each row gives the median and every round. `auto` is
`engine.threads`: once a second it measures the CPU other processes used and runs on the
cores they leave.

Writes its section of benchmarks/RESULTS.md.

    python -m benchmarks.speed.threads            # --quick for a smoke run (writes nothing)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.harness.targets import Target
from benchmarks.speed.offline_runners import (
    QUICK_SHAPE,
    SERVE_SHAPE,
    build_checkpoint,
    make_engine,
    make_workload,
    progress,
    warm_ours,
)
from engine import SamplingParams
from engine.threads import Threads

SECTION = "threads"
ARMS: list[Threads] = [1, 2, "auto"]
TARGETS = {
    "busy": Target("auto with a core taken, over 1 thread quiet (ratio)", 0.9),
    "quiet": Target("auto quiet, over 2 threads quiet (ratio)", 0.95),
}


@contextlib.contextmanager
def busy_core(busy: bool) -> Iterator[None]:
    """With `busy`, a busy-loop process pinned to the last core this process may use."""
    if not busy:
        yield
        return
    core = max(os.sched_getaffinity(0))
    spin = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    try:
        yield
    finally:
        spin.kill()
        spin.wait()


def run_arm(path: Path, wl: Any, threads: Threads) -> float:
    """Output tokens per second of the workload on a fresh engine (warmed up)."""
    engine = make_engine(path, wl, "continuous", len(wl.prompts), 2048, threads=threads)
    warm_ours(engine, engine.model_config.vocab_size)
    start = time.perf_counter()
    for prompt, n in zip(wl.prompts, wl.max_tokens, strict=True):
        engine.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return sum(wl.max_tokens) / (time.perf_counter() - start)


def runs(args: argparse.Namespace, path: Path, wl: Any) -> dict[tuple[str, str], list[float]]:
    """tok/s per (condition, threads) over the rounds."""
    out: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for condition in ("quiet", "busy"):
            with busy_core(condition == "busy"):
                for threads in ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]:
                    progress(f"round {r + 1}/{args.rounds}: {condition}, threads {threads}")
                    tok_s = run_arm(path, wl, threads)
                    out.setdefault((condition, str(threads)), []).append(tok_s)
    return out


def check_targets(res: dict[tuple[str, str], list[float]]) -> dict[str, dict[str, Any]]:
    med = {k: statistics.median(v) for k, v in res.items()}
    values = {
        "busy": med[("busy", "auto")] / med[("quiet", "1")],
        "quiet": med[("quiet", "auto")] / med[("quiet", "2")],
    }
    return {k: {"value": v, "met": TARGETS[k].met(v)} for k, v in values.items()}


def render(res: dict[tuple[str, str], list[float]], quiet_one: float) -> list[str]:
    lines = [
        "| condition | threads | out tok/s, median | each round | over 1 thread quiet |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (condition, threads), values in res.items():
        med = statistics.median(values)
        each = ", ".join(f"{v:.0f}" for v in values)
        lines.append(f"| {condition} | {threads} | {med:.0f} | {each} | {med / quiet_one:.2f} |")
    return lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a tiny model and workload, one round")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.requests = 1, 4
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    start = time.perf_counter()
    shape = QUICK_SHAPE if args.quick else SERVE_SHAPE
    lengths = ((4, 32), (2, 16)) if args.quick else ((16, 512), (8, 245))
    wl = make_workload(128, args.seed, shape.vocab, *lengths).subset(args.requests)
    meas = machine.measure()
    with tempfile.TemporaryDirectory() as tmp:
        res = runs(args, build_checkpoint(Path(tmp), shape, args.seed), wl)
    targets = check_targets(res)
    lines = [
        header(
            "Engine threads on a shared machine",
            ["python", "-m", "benchmarks.speed.threads", *argv],
            time.perf_counter() - start,
            meas,
        ),
        "",
        " ".join(__doc__.split("\n\n")[1].split()),
        f"Model: {shape.describe()}.",
        "",
        *render(res, statistics.median(res[("quiet", "1")])),
        "",
        *[TARGETS[k].line(c["value"], f"{c['value']:.2f}") for k, c in targets.items()],
    ]
    publish(SECTION, "\n".join(lines), results_path(args))
    return {"runs": res, "targets": targets}


if __name__ == "__main__":
    main()
