"""Where an engine step's host time goes, on the GPU engine benchmark's workload.

    python -m benchmarks.gpu.step_profile [--dry-run]

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

from benchmarks.gpu.engine_throughput import Workload, bench_workload, warmed

PHASES = ("schedule", "prepare", "forward", "sample", "total")


def profile(w: Workload) -> tuple[dict[str, Any], str]:
    """Phase means over decode-only steps, and cProfile's listing of the same steps."""
    engine, params = warmed("triton", w)
    for p in w.prompts:
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
            steps += 1
            wall += time.perf_counter() - t0
            for k in PHASES:
                sums[k] += getattr(result.telemetry.dur_ms, k)
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
    means, listing = profile(bench_workload(args.dry_run, args.requests, args.max_tokens, 128))
    print(
        "decode-only steps: "
        + ", ".join(f"{k} {v:.2f} ms" for k, v in means.items() if k != "decode_steps")
        + f" over {means['decode_steps']} steps"
    )
    print(listing)


if __name__ == "__main__":
    main()
