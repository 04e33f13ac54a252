"""Session recorder: throughput into SQLite, and step-time overhead of recording on vs off.

Throughput: synthesized StepTelemetry records of a busy server (64 running requests, every
one a decode slot; 8 layers x 64 experts; full latency and a2a fields) published at once to
a Recorder that buffers them all; steps/s is records over the time until all are committed.
Overhead: one engine (synthetic:medium: 8 layers x 64 experts) with 64 running requests,
stepped here the way the engine loop does (step, then publish the record if anyone is
subscribed), in rotating blocks with the recorder subscribed (on) and not (off, and off2
as an A/A control); the recorder thread writes to SQLite throughout. Writes a section of
benchmarks/RESULTS.md.
Run: `python -m benchmarks.speed.recorder` (`--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.harness.targets import Target
from engine import LLMEngine, SamplingParams
from engine.bus import TelemetryBus
from engine.telemetry import StepTelemetry
from stats import percentile
from storage import Recorder, Store

SECTION = "recorder"
TARGETS = {
    "overhead": Target("ratio of mean step time, recording on / off", 1.02, higher_is_better=False)
}


def synth_record(
    step: int, t: float, running: int, layers: int, experts: int, top_k: int = 4
) -> dict[str, Any]:
    """A full StepTelemetry record of a decode step with `running` requests, as a dict."""
    pairs = running * top_k
    counts = [
        [
            (pairs * (e + layer + 1)) // (experts * (experts + 1) // 2 + 1) % (pairs + 1)
            for e in range(experts)
        ]
        for layer in range(layers)
    ]
    return StepTelemetry.model_validate(
        {
            "session": "bench",
            "step": step,
            "t": t,
            "knobs_version": 1,
            "dur_ms": {
                "schedule": 0.21,
                "prepare": 0.93,
                "forward": 41.7,
                "moe": 27.3,
                "sample": 0.62,
                "total": 43.9,
            },
            "batch": {
                "max_slots": 64,
                "token_budget": 2048,
                "num_prefill_tokens": 0,
                "num_decode_tokens": running,
                "slots": [
                    {
                        "slot": i,
                        "req": f"cmpl-0123456789ab-{i}",
                        "phase": "decode",
                        "tokens": 1,
                        "ctx": 200 + i + step,
                    }
                    for i in range(running)
                ],
            },
            "queue": {
                "waiting": 3,
                "running": running,
                "swapped": 0,
                "arrived": 1,
                "finished": 1,
                "preempted": 0,
            },
            "kv": {
                "block_size": 16,
                "total": 2048,
                "usable": 2048,
                "used": 900,
                "cached": 40,
                "free": 1108,
                "tokens": 14200,
                "watermark_blocks": 20,
                "host_total": 512,
                "host_used": 0,
                "prefix_hit_rate": 0.1234,
            },
            "experts": {
                "layers": layers,
                "experts": experts,
                "top_k": top_k,
                "counts": counts,
                "dropped": [0] * layers,
                "balance": [round(0.4 + 0.01 * layer, 4) for layer in range(layers)],
            },
            "a2a": {"ep_size": 1, "mode": "modeled", "bytes": [[0]]},
            "latency": {"ttft_ms": [123.4], "tpot_ms": [41.2]},
        }
    ).model_dump()


def throughput(url: str, n: int, running: int, layers: int, experts: int) -> dict[str, Any]:
    """Publish `n` records at once; time until the recorder has committed them all."""
    template = synth_record(0, time.time(), running, layers, experts)
    records = [{**template, "step": i, "t": template["t"] + 0.05 * i} for i in range(n)]
    store = Store(url)
    steps, requests = TelemetryBus(), TelemetryBus()
    rec = Recorder(store, steps, requests, max_pending=n + 1)
    rec.start("throughput", model="synthetic", engine_session="bench", config={}, knobs={})
    start = time.perf_counter()
    for r in records:
        steps.publish(r)
    publish_s = time.perf_counter() - start
    assert rec.flush(timeout=600), "recorder did not finish"
    seconds = time.perf_counter() - start
    stats = rec.stats()
    rec.close()
    store.close()
    json_bytes = len(StepTelemetry.model_validate(template).model_dump_json())
    return {
        "steps": n,
        "seconds": seconds,
        "steps_per_s": n / seconds,
        "publish_us": 1e6 * publish_s / n,
        "json_bytes": json_bytes,
        "batches": stats["batches"],
        "dropped": stats["dropped_steps"],
    }


MODES = ("off", "on", "off2")


def overhead(
    url: str,
    model: str,
    running: int,
    groups: int,
    block: int,
    prompt: int,
) -> dict[str, Any]:
    """Blocks of decode steps with the recorder subscribed (on) and not (off, and off2 as an
    A/A control that shows the noise floor), in an order that rotates every group."""
    engine = LLMEngine(
        model=model,
        max_num_seqs=running,
        num_kv_blocks=4096,
        max_num_batched_tokens=max(2048, running * prompt),
    )
    params = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)
    for i in range(running):
        engine.add_request([(7 * i + j) % 250 + 1 for j in range(prompt)], params)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.requests.values()):
        engine.step()  # prefill, untimed
    for _ in range(3):
        engine.step()  # warm-up decodes
    store = Store(url)
    bus, requests = TelemetryBus(), TelemetryBus()
    rec = Recorder(store, bus, requests)
    rec.start("overhead", model=model, engine_session=engine.session, config={}, knobs={})
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for g in range(groups):
        for mode in MODES[g % 3 :] + MODES[: g % 3]:
            for _ in range(block):
                t0, c0 = time.perf_counter(), time.thread_time()
                result = engine.step()
                if mode == "on":  # off: as the loop with no subscriber, no record dict
                    bus.publish(result.telemetry.model_dump())
                times[mode].append(time.perf_counter() - t0)
                cpu[mode].append(time.thread_time() - c0)
    assert rec.flush(timeout=120)
    stats = rec.stats()
    rec.close()
    store.close()
    mean = {m: statistics.fmean(v) for m, v in times.items()}
    median = {m: percentile(v, 50) for m, v in times.items()}
    mean_cpu = {m: statistics.fmean(v) for m, v in cpu.items()}
    return {
        "model": model,
        "running": running,
        "groups": groups,
        "block": block,
        "mean_ms": {m: 1000 * v for m, v in mean.items()},
        "median_ms": {m: 1000 * v for m, v in median.items()},
        "cpu_ms": {m: 1000 * v for m, v in mean_cpu.items()},
        "ratio": mean["on"] / mean["off"],
        "aa_ratio": mean["off2"] / mean["off"],
        "median_ratio": median["on"] / median["off"],
        "aa_median_ratio": median["off2"] / median["off"],
        "cpu_ratio": mean_cpu["on"] / mean_cpu["off"],
        "written": stats["written_steps"],
        "recorder_cpu_ms_per_step": 1000 * stats["cpu_s"] / max(1, stats["written_steps"]),
        "layers": engine.model_config.num_layers,
        "experts": engine.model_config.num_experts,
    }


def render(
    args: argparse.Namespace,
    argv: list[str],
    tp: dict[str, Any],
    oh: dict[str, Any],
    db_bytes: float,
    total_s: float,
) -> str:
    """This benchmark's RESULTS.md section."""
    command = ["python", "-m", "benchmarks.speed.recorder", *argv]
    lines = [
        header(
            "Session recorder (`benchmarks/speed/recorder.py`)", command, total_s, machine.measure()
        ),
        "- Database: a SQLite file in WAL mode, synchronous=NORMAL. The cores are shared with "
        "other workers, so absolute numbers are noisy",
        "",
        f"Throughput: {tp['steps']} synthesized records of a busy step ({args.running} running "
        f"requests, all decode slots; {args.layers} layers x {args.experts} experts, top-4; "
        f"{tp['json_bytes']} bytes of JSON each) published at once to a Recorder "
        f"(batches of 256 steps a transaction).",
        "",
        "| steps | seconds | steps/s | MB/s of JSON | DB bytes per step | transactions | "
        "publish µs per step (engine side) | dropped |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {tp['steps']} | {tp['seconds']:.2f} | **{tp['steps_per_s']:.0f}** | "
        f"{tp['steps_per_s'] * tp['json_bytes'] / 1e6:.1f} | {db_bytes:.0f} | {tp['batches']} | "
        f"{tp['publish_us']:.1f} | {tp['dropped']} |",
        "",
        f"Overhead: `{oh['model']}` ({oh['layers']} layers x {oh['experts']} experts), "
        f"{oh['running']} running requests in decode, {oh['groups']} groups of three "
        f"{oh['block']}-step blocks (off, on, off2; the order rotates every group), each step "
        f"timed as the engine loop runs it (step + `model_dump` + publish when subscribed). "
        f"On: the recorder subscribed, writing every step to SQLite on its thread "
        f"({oh['written']} steps written). Off and off2: nothing subscribed (no record dict "
        f"is built); off2 / off is an A/A control: the noise floor of this design here.",
        "",
        "| recording | steps | mean step ms (wall) | median step ms (wall) | "
        "mean engine-thread CPU ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for mode in MODES:
        lines.append(
            f"| {mode} | {oh['groups'] * oh['block']} | {oh['mean_ms'][mode]:.3f} | "
            f"{oh['median_ms'][mode]:.3f} | {oh['cpu_ms'][mode]:.3f} |"
        )
    share = oh["recorder_cpu_ms_per_step"] / oh["mean_ms"]["off"]
    lines += [
        "",
        f"Ratio of mean step time on / off: **{oh['ratio']:.4f}** "
        f"({(oh['ratio'] - 1) * 100:+.2f}%; medians {oh['median_ratio']:.4f}; engine-thread "
        f"CPU {oh['cpu_ratio']:.4f}). A/A control off2 / off: {oh['aa_ratio']:.4f} (medians "
        f"{oh['aa_median_ratio']:.4f}). The recorder thread "
        f"spent {oh['recorder_cpu_ms_per_step']:.3f} ms of CPU per step written, "
        f"{100 * share:.2f}% of a mean step; it runs beside the engine thread, so recording "
        f"moves step time only through contention for the cores and the GIL.",
        "",
        "Targets:",
        "",
        TARGETS["overhead"].line(oh["ratio"], f"{oh['ratio']:.4f}"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure and publish; returns the throughput and overhead runs and the target."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000, help="records for the throughput run")
    p.add_argument("--running", type=int, default=64, help="running requests")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--model", default="synthetic:medium", help="engine for the overhead run")
    p.add_argument("--groups", type=int, default=20, help="groups of off/on/off2 blocks")
    p.add_argument("--block", type=int, default=8, help="steps per block")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per request")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--db-dir", type=Path, default=None, help="where the SQLite files go")
    p.add_argument("--quick", action="store_true", help="synthetic:tiny, a few steps")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.model, args.running = 300, "synthetic:tiny", 8
        args.groups, args.block = 3, 2
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.db_dir) as tmp:
        path = Path(tmp) / "throughput.db"
        tp = throughput(f"sqlite:///{path}", args.steps, args.running, args.layers, args.experts)
        db_bytes = sum(f.stat().st_size for f in Path(tmp).glob("throughput.db*")) / args.steps
        print(f"throughput: {tp['steps_per_s']:.0f} steps/s", file=sys.stderr, flush=True)
        oh = overhead(
            f"sqlite:///{Path(tmp) / 'overhead.db'}",
            args.model,
            args.running,
            args.groups,
            args.block,
            args.prompt,
        )
        print(f"overhead: on/off {oh['ratio']:.4f}", file=sys.stderr, flush=True)
    section = render(args, argv, tp, oh, db_bytes, time.perf_counter() - started)
    publish(SECTION, section, results_path(args))
    ratio = oh["ratio"]
    return {
        "throughput": tp,
        "overhead": oh,
        "db_bytes_per_step": db_bytes,
        "targets": {"overhead": {"value": ratio, "met": TARGETS["overhead"].met(ratio)}},
    }


if __name__ == "__main__":
    main()
