"""The forward pass on the CPU: prefill and decode tokens per second, float32 against bf16.

One workload on issue 17's model (and on a fine-grained MoE shape): 128 requests arriving at
once, prompts log-uniform 16-512 tokens, 32 output tokens each, greedy. Prefill tok/s is the
prompt tokens over the forward seconds of the steps that carry them; decode tok/s at batch
128 is 128 over the median forward of the decode-only steps with all 128 running. Arms
(float32, bf16 and float32 again, an A/A control, with the experts on the CPU's default
backend, the native grouped GEMM; then the previous defaults: oneDNN experts for float32,
grouped_mm for bf16) run in rotating order, each round on a fresh engine, at a fixed thread
count. Each row's headline is its fastest round (the one other processes on the shared
machine disturbed least); every round is shown beside it, and the f32 A/A row is the noise
floor of that choice.

Writes its section of benchmarks/RESULTS.md.

    python -m benchmarks.speed.forward            # --quick for a smoke run (writes nothing)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.harness.targets import Target
from benchmarks.speed.offline_runners import (
    FINE_SHAPE,
    QUICK_SHAPE,
    SERVE_SHAPE,
    Shape,
    build_checkpoint,
    make_engine,
    make_workload,
    moe_backend,
    progress,
    warm_ours,
)
from engine import SamplingParams

SECTION = "forward"
# arm -> (dtype, MoE backend; None: the CPU's default, the native grouped GEMM). The oneDNN
# and grouped_mm arms are the defaults before it, measured beside it.
ARMS: dict[str, tuple[str, str | None]] = {
    "f32": ("float32", None),
    "bf16": ("bfloat16", None),
    "f32 (A/A)": ("float32", None),
    "f32, oneDNN experts": ("float32", "onednn"),
    "bf16, grouped_mm experts": ("bfloat16", "torch"),
}
TARGETS = {
    "decode": Target("decode at batch 128, the faster precision's fastest round (tok/s)", 1500),
    "prefill": Target("prefill, the faster precision's fastest round (tok/s)", 2500),
    "bf16": Target("bf16 over float32, whole workload's forward time, fastest rounds", 1.3),
}

DIGITS = {"decode": 0, "prefill": 0, "bf16": 2}


@dataclass
class Arm:
    """One arm's run: prompt tokens and forward seconds of steps with prefill, decode-only
    forward seconds at the full batch, and every step's forward seconds."""

    prefill_tokens: int
    prefill_s: float
    full_decode_s: list[float]
    forward_s: float

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s

    def decode_tok_s(self, batch: int) -> float:
        return batch / statistics.median(self.full_decode_s)


def run_arm(path: Path, dtype: str, wl: Any, threads: int) -> Arm:
    """A fresh engine, warmed up, then the workload at once, summed from its telemetry."""
    batch = len(wl.prompts)
    engine = make_engine(path, wl, "continuous", batch, 2048, dtype=dtype, threads=threads)
    warm_ours(engine, engine.model_config.vocab_size)
    for prompt, n in zip(wl.prompts, wl.max_tokens, strict=True):
        engine.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    arm = Arm(0, 0.0, [], 0.0)
    while engine.has_unfinished():
        tele = engine.step().telemetry
        forward = tele.dur_ms.forward / 1e3
        arm.forward_s += forward
        if tele.batch.num_prefill_tokens:
            arm.prefill_tokens += tele.batch.num_prefill_tokens
            arm.prefill_s += forward
        elif tele.batch.num_decode_tokens == len(wl.prompts):
            arm.full_decode_s.append(forward)
    return arm


def run_shape(args: argparse.Namespace, name: str, shape: Shape, root: Path) -> dict[str, Any]:
    """Every arm on one shape, `args.rounds` rounds in rotating order."""
    path = build_checkpoint(root / name, shape, args.seed)
    wl = make_workload(args.requests, args.seed, shape.vocab, args.prompt_range, (32, 32))
    if args.quick:
        wl = make_workload(args.requests, args.seed, shape.vocab, (4, 32), (4, 4))
    names = list(ARMS)
    arms: dict[str, list[Arm]] = {n: [] for n in names}
    for r in range(args.rounds):
        for arm in names[r % len(names) :] + names[: r % len(names)]:
            progress(f"{name}: round {r + 1}/{args.rounds}, {arm}")
            dtype, backend = ARMS[arm]
            with moe_backend(backend):
                arms[arm].append(run_arm(path, dtype, wl, args.threads))
    return {"shape": shape, "arms": arms, "batch": args.requests}


def fastest(runs: list[Arm]) -> Arm:
    """The round least disturbed by other processes on the shared machine."""
    return min(runs, key=lambda a: a.forward_s)


def check_targets(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    arms, batch = result["arms"], result["batch"]
    best = min((fastest(arms["f32"]), fastest(arms["bf16"])), key=lambda a: a.forward_s)
    values = {
        "decode": best.decode_tok_s(batch),
        "prefill": best.prefill_tok_s,
        "bf16": fastest(arms["f32"]).forward_s / fastest(arms["bf16"]).forward_s,
    }
    return {k: {"value": v, "met": TARGETS[k].met(v)} for k, v in values.items()}


def render_shape(name: str, result: dict[str, Any]) -> list[str]:
    arms, batch, shape = result["arms"], result["batch"], result["shape"]
    lines = [
        f"### {name}: {shape.describe()}",
        "",
        "| arm | prefill tok/s, fastest round (each round) | decode tok/s at batch "
        f"{batch} (each round) | forward s (each round) | fastest over f32's fastest |",
        "| --- | --- | --- | --- | --- |",
    ]
    base = fastest(arms["f32"]).forward_s
    for arm, runs in arms.items():
        best = fastest(runs)
        pre = _cell(best.prefill_tok_s, [a.prefill_tok_s for a in runs], 0)
        dec = _cell(best.decode_tok_s(batch), [a.decode_tok_s(batch) for a in runs], 0)
        fwd = _cell(best.forward_s, [a.forward_s for a in runs], 2)
        lines.append(f"| {arm} | {pre} | {dec} | {fwd} | {base / best.forward_s:.2f} |")
    return lines


def _cell(best: float, values: list[float], digits: int) -> str:
    each = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{best:.{digits}f} ({each})"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a tiny model and workload, one round")
    add_results_arguments(p)
    args = p.parse_args(argv)
    args.prompt_range = (16, 512)
    if args.quick:
        args.rounds, args.requests = 1, 4
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    start = time.perf_counter()
    shapes = {"quick": QUICK_SHAPE} if args.quick else {"issue 17's model": SERVE_SHAPE}
    if not args.quick:
        shapes["fine-grained experts"] = FINE_SHAPE
    torch.set_num_threads(args.threads)
    meas = machine.measure()
    with tempfile.TemporaryDirectory() as tmp:
        results = {n: run_shape(args, n, s, Path(tmp)) for n, s in shapes.items()}
    first = next(iter(results.values()))
    targets = check_targets(first)
    lines = [
        header(
            f"Forward pass on the CPU: float32 and bf16 at {args.threads} threads",
            ["python", "-m", "benchmarks.speed.forward", *argv],
            time.perf_counter() - start,
            meas,
        ),
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
    ]
    for name, result in results.items():
        lines += [*render_shape(name, result), ""]
    lines.append("Targets (issue 17's model):")
    for key, check in targets.items():
        lines.append(TARGETS[key].line(check["value"], f"{check['value']:.{DIGITS[key]}f}"))
    publish(SECTION, "\n".join(lines), results_path(args))
    return {"results": results, "targets": targets}


if __name__ == "__main__":
    main()
