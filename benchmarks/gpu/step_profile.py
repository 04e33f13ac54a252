"""Where an engine step's host time goes, on the GPU engine benchmark's workload.

    python benchmarks/gpu/step_profile.py [--dry-run]

One engine on the Triton backends (decode CUDA graphs on), warmed and then given all requests
at once, as engine_throughput.py runs it. For the decode-only steps it reports the mean of each
phase the step times itself (schedule, prepare, forward, sample), the wall time of the whole
`step()` call (which also builds the telemetry record), and cProfile's top functions over those
steps. The profiler's own overhead inflates every phase but the GPU's share.
"""

import argparse
import cProfile
import io
import pstats
import time
from typing import Any

from bench_util import pick_device
from engine_throughput import LARGE, warmed, workload

PHASES = ("schedule", "prepare", "forward", "sample", "total")


def profile(
    model: str, device: str, dtype: str, prompts: list[list[int]], max_tokens: int
) -> tuple[dict[str, Any], str]:
    """Phase means over decode-only steps, and cProfile's listing of the same steps."""
    engine, params = warmed("triton", model, device, dtype, prompts, max_tokens, 128)
    for p in prompts:
        engine.add_request(p, params)
    sums = dict.fromkeys(PHASES, 0.0)
    wall, steps = 0.0, 0
    prof = cProfile.Profile()
    while engine.has_unfinished():
        sched = engine.scheduler
        decoding = not sched.waiting and not any(r.in_prefill for r in sched.running)
        t0 = time.perf_counter()
        if decoding:
            prof.enable()
        result = engine.step()
        if decoding:
            prof.disable()
        dt = time.perf_counter() - t0
        tel = result.telemetry
        if decoding and tel.batch.num_prefill_tokens == 0:
            steps += 1
            wall += dt
            for k in PHASES:
                sums[k] += getattr(tel.dur_ms, k)
    means = {k: v / max(1, steps) for k, v in sums.items()}
    means["step_call_wall"] = wall * 1e3 / max(1, steps)
    means["decode_steps"] = steps
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(35)
    stats.sort_stats("cumulative").print_stats(35)
    return means, text.getvalue()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--dry-run", action="store_true", help="synthetic:tiny on the CPU")
    args = p.parse_args(argv)
    device = pick_device(args.dry_run)
    from engine.model.loader import SYNTHETIC_PRESETS

    SYNTHETIC_PRESETS.setdefault("gpu-bench", LARGE)
    if args.dry_run:
        model, dtype, prompts, max_tokens = "synthetic:tiny", "float32", workload(3, 0, (4, 12)), 4
    else:
        model, dtype = "synthetic:gpu-bench", "bfloat16"
        prompts, max_tokens = workload(args.requests, 0, (64, 512)), args.max_tokens
    means, listing = profile(model, str(device), dtype, prompts, max_tokens)
    print(
        "decode-only steps: "
        + ", ".join(f"{k} {v:.2f} ms" for k, v in means.items() if k != "decode_steps")
        + f" over {means['decode_steps']} steps"
    )
    print(listing)


if __name__ == "__main__":
    main()
