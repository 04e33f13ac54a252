"""The step loop's host work on the CPU: Python time per running request (issue 47).

synthetic:tiny on one torch thread, N requests of 8-token prompts all decoding (greedy, no
EOS, so none ends), each step timed around `LLMEngine.step()`. Per step: wall time, the
forward time the step records in its telemetry (`dur_ms.forward`), host time = wall -
forward (scheduling, building the batch, sampling, updating requests and outputs, the
telemetry record), and host µs per running request. Two engines of the same configuration,
A and its A/A control, step in alternating blocks; cells are medians over a window of steps,
and A/A against A is the noise floor. A third engine, "overlap", is A with overlap on: it
plans step N+1 while step N's forward pass runs on its compute thread, so wall - forward is
the host time left exposed; `hidden` is the host time (`dur_ms.host`) that ran meanwhile.
The early window starts after a few warm-up decode steps; the late one ends the run, when
every request holds several hundred output tokens: a host cost that grows with a request's
length shows up as late over early above 1. Not all of that ratio is such a cost: after the
late steps' longer forward passes, even fixed-cost host code (building the step's `dur_ms`,
say) ran 1.6-2x slower here, on cold caches. So a fourth engine, "long prompt", runs the late
window's context lengths with prompts that long and only a few output tokens: late over it
is the host cost that grows with a request's output alone.

Writes its section of benchmarks/RESULTS.md.

    python -m benchmarks.speed.step_loop          # --quick for a smoke run (writes nothing)
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.harness.targets import Target
from engine import LLMEngine, SamplingParams

SECTION = "step_loop"
MODEL = "synthetic:tiny"
PROMPT = 8
WARMUP = 4  # decode steps before the early window
ARMS = ("A", "A/A")
OVERLAP = "overlap"  # A with overlap on
MATCHED = "long prompt"  # the late window's context lengths, with few output tokens
PREFILL_BUDGET = 65536  # tokens a prefill step may take: long prompts take a few steps
TARGETS = {
    "exposed": Target(
        "exposed host time per decode step at 256 running, over forward time (early window, "
        "overlap)",
        0.15,
        higher_is_better=False,
    ),
    "flat": Target(
        "host µs per request at 1024 running, late window over early", 1.1, higher_is_better=False
    ),
}


@dataclass
class Steps:
    """One arm's measured decode steps: seconds and the output tokens each request held."""

    wall_s: list[float] = field(default_factory=list)
    forward_s: list[float] = field(default_factory=list)
    parts_ms: list[dict[str, float]] = field(default_factory=list)  # schedule, prepare, ...
    output_len: list[int] = field(default_factory=list)


@dataclass
class Window:
    """Medians over a window of steps of one arm at `running` requests."""

    running: int
    output_len: int  # at the window's middle step
    wall_ms: float
    forward_ms: float
    host_ms: float  # median of each step's wall - forward
    parts_ms: dict[str, float]

    @property
    def host_over_forward(self) -> float:
        return self.host_ms / self.forward_ms

    @property
    def host_us_per_request(self) -> float:
        return 1000 * self.host_ms / self.running


def window(steps: Steps, running: int, start: int, stop: int) -> Window:
    wall = steps.wall_s[start:stop]
    forward = steps.forward_s[start:stop]
    parts = steps.parts_ms[start:stop]
    return Window(
        running=running,
        output_len=steps.output_len[(start + stop) // 2],
        wall_ms=1000 * statistics.median(wall),
        forward_ms=1000 * statistics.median(forward),
        host_ms=1000 * statistics.median(w - f for w, f in zip(wall, forward, strict=True)),
        parts_ms={k: statistics.median(p[k] for p in parts) for k in parts[0]},
    )


def decoding_engine(running: int, prompt: int, length: int, overlap: bool = False) -> LLMEngine:
    """An engine with `running` requests of `prompt` tokens prefilled and past the warm-up
    decode steps; each can decode `length` more tokens without ending."""
    budget = min(running * prompt, PREFILL_BUDGET)
    # a request prefilled in an early step decodes while the others still prefill
    max_tokens = -(-running * prompt // budget) + WARMUP + length + 2
    engine = LLMEngine(
        model=MODEL,
        max_num_seqs=running,
        num_kv_blocks=running * -(-(prompt + max_tokens) // 16),
        max_num_batched_tokens=budget,
        threads=1,
        overlap=overlap,
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(running):
        engine.add_request([(7 * i + j) % 250 + 1 for j in range(prompt)], params)
    while engine.step().telemetry.batch.num_prefill_tokens:
        pass
    for _ in range(WARMUP - 1):  # the step that ended the loop decoded every request
        engine.step()
    return engine


def timed_step(engine: LLMEngine, steps: Steps, running: int, prompt: int) -> None:
    t0 = time.perf_counter()
    result = engine.step()
    wall = time.perf_counter() - t0
    tele = result.telemetry
    assert tele.batch.num_decode_tokens == running and not tele.batch.num_prefill_tokens
    steps.wall_s.append(wall)
    steps.forward_s.append(tele.dur_ms.forward / 1000)
    d = tele.dur_ms
    steps.parts_ms.append(
        {
            "schedule": d.schedule,
            "prepare": d.prepare,
            "sample": d.sample,
            "host": d.host,
            "hidden": d.hidden,
        }
    )
    steps.output_len.append(tele.batch.slots[0].ctx - prompt + 1)


def run_size(running: int, length: int, block: int, width: int) -> dict[str, Steps]:
    """A and A/A run `length` decode steps each and the long-prompt engine `width`, in blocks
    of `block` whose order rotates; the long-prompt engine joins for the late window, so that
    all three arms run it under the same conditions."""
    long_prompt = PROMPT + length - width
    prompts = {**dict.fromkeys((*ARMS, OVERLAP), PROMPT), MATCHED: long_prompt}
    todo = {**dict.fromkeys((*ARMS, OVERLAP), length), MATCHED: width}
    engines = {
        arm: decoding_engine(running, prompts[arm], todo[arm], overlap=arm == OVERLAP)
        for arm in prompts
    }
    steps = {arm: Steps() for arm in prompts}
    for b in itertools.count():
        late = len(steps["A"].wall_s) >= length - width
        arms = [a for a in engines if len(steps[a].wall_s) < todo[a] and (late or a != MATCHED)]
        if not arms:
            break
        for arm in arms[b % len(arms) :] + arms[: b % len(arms)]:
            for _ in range(min(block, todo[arm] - len(steps[arm].wall_s))):
                timed_step(engines[arm], steps[arm], running, prompts[arm])
            engines[arm].settle()  # its step in flight must not run into the next arm's
    for engine in engines.values():
        engine.close()
    del engines
    gc.collect()
    return steps


def summarize(runs: dict[int, dict[str, Steps]], width: int) -> dict[str, Any]:
    """Early and late windows per size and arm, and the targets."""
    windows: dict[str, dict[tuple[int, str], Window]] = {"early": {}, "late": {}}
    for running, arms in runs.items():
        for arm, steps in arms.items():
            n = len(steps.wall_s)
            if arm != MATCHED:
                windows["early"][running, arm] = window(steps, running, 0, width)
            windows["late"][running, arm] = window(steps, running, n - width, n)
    sizes = sorted(runs)
    at_256 = 256 if 256 in runs else sizes[len(sizes) // 2]
    early, late = windows["early"], windows["late"]
    largest = sizes[-1], "A"
    values = {
        "exposed": early[at_256, OVERLAP].host_over_forward,
        "flat": late[largest].host_us_per_request / early[largest].host_us_per_request,
    }
    targets = {k: {"value": v, "met": TARGETS[k].met(v)} for k, v in values.items()}
    return {"windows": windows, "targets": targets}


def render_windows(name: str, windows: dict[tuple[int, str], Window]) -> list[str]:
    lines = [
        f"{name} window:",
        "",
        "| running | arm | output tokens | wall ms | forward ms | exposed host ms | "
        "exposed / forward | exposed µs per request | schedule ms | prepare ms | "
        "sample + update ms | host ms | hidden ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (running, arm), w in sorted(windows.items()):  # A, A/A, long prompt, overlap
        p = w.parts_ms
        lines.append(
            f"| {running} | {arm} | {w.output_len} | {w.wall_ms:.2f} | {w.forward_ms:.2f} | "
            f"{w.host_ms:.2f} | {w.host_over_forward:.2f} | **{w.host_us_per_request:.1f}** | "
            f"{p['schedule']:.2f} | {p['prepare']:.2f} | {p['sample']:.2f} | "
            f"{p['host']:.2f} | {p['hidden']:.2f} |"
        )
    return lines


def render_flatness(summary: dict[str, Any]) -> list[str]:
    early, late = summary["windows"]["early"], summary["windows"]["late"]
    lines = [
        "Host µs per request in the late window, over the early window (1: no cost grows with "
        "a request's length) and over the long-prompt engine at the same context lengths (1: "
        "none grows with its output); exposed host time over forward time, overlap off (A) "
        "and on:",
        "",
        "| running | late / early, A | late / early, A/A | late / long prompt, A | "
        "exposed / forward, A | exposed / forward, overlap |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for running in sorted({r for r, _ in early}):
        us = late[running, "A"].host_us_per_request
        ratios = [
            late[running, a].host_us_per_request / early[running, a].host_us_per_request
            for a in ARMS
        ]
        matched = us / late[running, MATCHED].host_us_per_request
        off, on = (early[running, a].host_over_forward for a in ("A", OVERLAP))
        lines.append(
            f"| {running} | {ratios[0]:.2f} | {ratios[1]:.2f} | {matched:.2f} | "
            f"{off:.2f} | {on:.2f} |"
        )
    return lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--length", type=int, default=512, help="decode steps each arm runs")
    p.add_argument("--window", type=int, default=32, help="steps in each window")
    p.add_argument("--block", type=int, default=4, help="steps in a row of one arm")
    p.add_argument("--quick", action="store_true", help="small sizes, short requests")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.length, args.window, args.block = [4, 16], 12, 4, 2
    if not 0 < args.window <= args.length:
        p.error("--window must be between 1 and --length")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    start = time.perf_counter()
    torch.set_num_threads(1)
    meas = machine.measure()
    runs = {}
    for running in sorted(args.sizes):
        print(f"step_loop: {running} running", file=sys.stderr, flush=True)
        runs[running] = run_size(running, args.length, args.block, args.window)
    summary = summarize(runs, args.window)
    lines = [
        header(
            f"Step loop: host time per running request (`{MODEL}`, 1 thread)",
            ["python", "-m", "benchmarks.speed.step_loop", *argv],
            time.perf_counter() - start,
            meas,
        ),
        f"- Commit: {machine.engine_revision()}",
        "",
        __doc__.split("\n\n")[1].replace("\n", " ")
        + f" A and A/A run {args.length} decode steps each and the long-prompt engine "
        f"{args.window}, in blocks of {args.block}; windows are {args.window} steps.",
        "",
        *render_windows("Early", summary["windows"]["early"]),
        "",
        *render_windows("Late", summary["windows"]["late"]),
        "",
        *render_flatness(summary),
        "",
        "Targets (issue 47):",
        "",
    ]
    for key, check in summary["targets"].items():
        lines.append(TARGETS[key].line(check["value"], f"{check['value']:.2f}"))
    publish(SECTION, "\n".join(lines), results_path(args))
    return {"runs": runs, **summary}


if __name__ == "__main__":
    main()
