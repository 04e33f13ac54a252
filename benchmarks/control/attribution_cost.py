"""Latency attribution's cost: the engine thread's step time and the bytes stored per step, with
the scheduler's record of why requests waited (StepTelemetry `sched`) on and off.

One engine with a full batch and a long waiting queue (kept topped up, so that every step
blocks admission and records why), stepped as the engine loop steps it (step, then
`model_dump` for the buses), in rotating blocks: on, off, and on2 as an A/A control. Off
turns the bookkeeping out of the scheduler and the record (`attribution`): what the engine
did before telemetry v2; every arm patches the same names (on with themselves). Storage
is the JSON of each step record as the recorder stores it, with and without its `sched`.
Writes a section of benchmarks/RESULTS.md.
Run: `python -m benchmarks.control.attribution_cost` (`--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

import engine.step_telemetry
from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.harness.targets import Target
from engine import LLMEngine, SamplingParams
from engine.scheduler import Scheduler
from engine.telemetry import SchedInfo

SECTION = "attribution_cost"
TARGETS = {
    "step": Target("engine-thread step time, attribution on / off", 1.01, higher_is_better=False),
    "storage": Target("stored bytes per step, on / off", 1.10, higher_is_better=False),
}
MODES = ("on", "off", "on2")


@contextlib.contextmanager
def attribution(on: bool) -> Iterator[None]:
    """Off: the scheduler notes no blocking reason and the record carries an empty `sched`.
    On patches the same names with themselves: patching a class or a module invalidates the
    interpreter's attribute caches, which alone costs a few percent of a block of steps, so
    both arms pay it alike."""
    empty = SchedInfo()
    real = Scheduler.__dict__["_ahead"], Scheduler.__dict__["_blocked"], SchedInfo
    off = (
        staticmethod(lambda out, req: None),
        lambda self, out, reason, head: None,
        lambda **_: empty,
    )
    ahead, blocked, info = real if on else off
    with (
        mock.patch.object(Scheduler, "_ahead", ahead),
        mock.patch.object(Scheduler, "_blocked", blocked),
        mock.patch.object(engine.step_telemetry, "SchedInfo", info),
    ):
        yield


def stored_bytes(record: dict[str, Any], with_sched: bool) -> int:
    """The JSON the recorder stores for a step (its `data` column)."""
    if not with_sched:
        record = {k: v for k, v in record.items() if k != "sched"}
    return len(json.dumps(record, separators=(",", ":")))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    eng = LLMEngine(model=args.model, max_num_seqs=args.running, num_kv_blocks=4096)
    params = SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True)
    n = 0

    def top_up() -> None:
        nonlocal n
        while len(eng.scheduler.waiting) < args.waiting:
            eng.add_request([(7 * n + j) % 250 + 1 for j in range(args.prompt)], params)
            n += 1

    top_up()
    for _ in range(args.warmup):
        eng.step()
        top_up()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    kept: list[dict[str, Any]] = []
    for g in range(args.groups):
        for mode in MODES[g % 3 :] + MODES[: g % 3]:
            with attribution(on=mode != "off"):
                for _ in range(args.block):
                    top_up()
                    t0, c0 = time.perf_counter(), time.thread_time()
                    record = eng.step().telemetry.model_dump()
                    times[mode].append(time.perf_counter() - t0)
                    cpu[mode].append(time.thread_time() - c0)
                    if mode == "on":  # sized after the run: its garbage would land in a block
                        kept.append(record)
    mean = {m: 1000 * statistics.fmean(v) for m, v in times.items()}
    mean_cpu = {m: 1000 * statistics.fmean(v) for m, v in cpu.items()}
    on_steps = len(kept)
    blocked = sum(r["sched"]["blocked"] is not None for r in kept)
    size = {on: sum(stored_bytes(r, on) for r in kept) for on in (True, False)}
    return {
        "mean_ms": mean,
        "cpu_ms": mean_cpu,
        "ratio": mean["on"] / mean["off"],
        "aa_ratio": mean["on2"] / mean["on"],
        "cpu_ratio": mean_cpu["on"] / mean_cpu["off"],
        "steps": on_steps,
        "blocked_share": blocked / on_steps,
        "bytes_on": size[True] / on_steps,
        "bytes_off": size[False] / on_steps,
        "layers": eng.model_config.num_layers,
        "experts": eng.model_config.num_experts,
    }


def render(args: argparse.Namespace, argv: list[str], r: dict[str, Any], total_s: float) -> str:
    command = ["python", "-m", "benchmarks.control.attribution_cost", *argv]
    storage = r["bytes_on"] / r["bytes_off"]
    lines = [
        header(
            "Latency attribution: cost (`benchmarks/control/attribution_cost.py`)",
            command,
            total_s,
            machine.measure(),
        ),
        "",
        f"`{args.model}` ({r['layers']} layers x {r['experts']} experts), {args.running} "
        f"running requests and {args.waiting} kept waiting (prompts of {args.prompt} tokens), "
        f"{args.groups} groups of three {args.block}-step blocks (on, off, on2; the order "
        f"rotates every group), each step timed as the engine loop runs it (`step` + "
        f"`model_dump`). Off: no blocking reasons noted and an empty `sched` (the engine "
        f"before telemetry v2); both arms patch the same names, on with themselves, since "
        f"patching alone slows a block of steps by a few percent. Admission was blocked in "
        f"{100 * r['blocked_share']:.0f}% of the steps on.",
        "",
        "| attribution | steps | mean step ms (wall) | mean engine-thread CPU ms |",
        "| --- | --- | --- | --- |",
    ]
    for mode in MODES:
        lines.append(
            f"| {mode} | {r['steps']} | {r['mean_ms'][mode]:.3f} | {r['cpu_ms'][mode]:.3f} |"
        )
    lines += [
        "",
        f"Step time on / off: **{r['ratio']:.4f}** (engine-thread CPU {r['cpu_ratio']:.4f}); "
        f"A/A control on2 / on: {r['aa_ratio']:.4f}, the noise floor of this design here.",
        f"Stored JSON per step: {r['bytes_on']:.0f} bytes on, {r['bytes_off']:.0f} off: "
        f"**{storage:.4f}**.",
        "",
        "Targets:",
        "",
        TARGETS["step"].line(r["ratio"], f"{r['ratio']:.4f}"),
        TARGETS["storage"].line(storage, f"{storage:.4f}"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic:small")
    p.add_argument("--running", type=int, default=32, help="batch slots (max_num_seqs)")
    p.add_argument("--waiting", type=int, default=200, help="requests kept waiting")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per request")
    p.add_argument("--output", type=int, default=32, help="output tokens per request")
    p.add_argument("--groups", type=int, default=30, help="groups of on/off/on2 blocks")
    p.add_argument("--block", type=int, default=10, help="steps per block")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--quick", action="store_true", help="synthetic:tiny, a few steps")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.running, args.waiting = "synthetic:tiny", 4, 8
        args.groups, args.block, args.warmup = 3, 2, 2
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    r = measure(args)
    print(f"attribution cost: step on/off {r['ratio']:.4f}", file=sys.stderr, flush=True)
    publish(SECTION, render(args, argv, r, time.perf_counter() - started), results_path(args))
    return r


if __name__ == "__main__":
    main()
