"""The offline engine on a larger synthetic model, on the GPU in bf16, per backend.

    python -m benchmarks.gpu.engine_throughput --json engine.json [--dry-run] [--model M]

All requests arrive at once (seeded random prompts, greedy, EOS ignored). The engine runs
on the Triton backends with decode CUDA graphs (`triton`), without them (`triton-eager`,
MOESCOPE_DECODE_GRAPHS=0) and on the torch backends (`torch`; MOESCOPE_MOE_BACKEND and
MOESCOPE_ATTN_BACKEND); the backends --overlap names (default: triton) run again with the
engine's `overlap` on, on an engine of their own (each step planned while the one before runs,
issue 47). Each run reports output tokens per second, steps, the summed forward time of all
steps (`dur_ms.forward`) and its share of the wall time (the forward-only ceiling: 1 when the
device never waits for the host), and per decode-only step the mean forward time, host time
(`dur_ms.host`) and the part of it hidden behind a forward pass (`dur_ms.hidden`). The model
is a synthetic preset registered here, wider than the engine's own presets (see LARGE), unless
--model names another (run_all.sh also runs synthetic:dsv2-lite, whose MLA decodes in the
graphs too).
"""

import argparse
import os
import random
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.gpu.bench_util import pick_device, save

if TYPE_CHECKING:
    from engine import LLMEngine, SamplingParams
    from engine.telemetry import Durations

LARGE = dict(
    hidden_size=1024,
    num_layers=8,
    num_heads=16,
    num_kv_heads=4,
    head_dim=64,
    moe_intermediate_size=512,
    num_experts=64,
    top_k=8,
    max_model_len=4096,
    router_skew=0.6,
)


def workload(n: int, seed: int, prompt_range: tuple[int, int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 256) for _ in range(rng.randint(*prompt_range))] for _ in range(n)]


@dataclass(frozen=True)
class Workload:
    """What an engine run serves, and on what."""

    model: str
    device: str
    dtype: str
    prompts: list[list[int]]
    max_tokens: int
    max_num_seqs: int


def bench_workload(
    dry_run: bool, requests: int, max_tokens: int, max_num_seqs: int, model: str | None = None
) -> Workload:
    """The GPU benchmark's workload on `model` (default synthetic:gpu-bench; synthetic:tiny
    on the CPU for a dry run)."""
    device = str(pick_device(dry_run))
    from engine.model.loader import SYNTHETIC_PRESETS

    SYNTHETIC_PRESETS.setdefault("gpu-bench", LARGE)
    if dry_run:
        tiny = workload(3, 0, (4, 12))
        return Workload(model or "synthetic:tiny", device, "float32", tiny, 3, max_num_seqs)
    prompts = workload(requests, 0, (64, 512))
    name = model or "synthetic:gpu-bench"
    return Workload(name, device, "bfloat16", prompts, max_tokens, max_num_seqs)


def warmed(
    backend: str, w: Workload, overlap: bool = False
) -> tuple["LLMEngine", "SamplingParams"]:
    """An engine on `backend` (with `overlap` on or off) that has run a workload of the same
    lengths once, and the sampling parameters to run `w.prompts` with."""
    from engine import LLMEngine, SamplingParams

    kernels = backend.removesuffix("-eager")
    os.environ["MOESCOPE_MOE_BACKEND"] = kernels
    os.environ["MOESCOPE_ATTN_BACKEND"] = kernels
    os.environ["MOESCOPE_DECODE_GRAPHS"] = "0" if backend.endswith("-eager") else "1"
    if w.device == "cpu":
        os.environ.pop("MOESCOPE_DECODE_GRAPHS")  # the CPU default: off
    engine = LLMEngine(
        model=w.model,
        device=w.device,
        dtype=w.dtype,
        num_kv_blocks=16384,
        block_size=16,
        max_num_seqs=w.max_num_seqs,
        max_num_batched_tokens=4096,
        prefill_chunk_size=2048,
        overlap=overlap,
    )
    params = SamplingParams(max_tokens=w.max_tokens, temperature=0, ignore_eos=True)
    # Warm-up on the whole workload: Triton compiles a kernel per specialization of its
    # shapes, and decode graphs are captured per batch size, so a short warm-up left those
    # compiles in the timed run of whichever backend ran first. Other prompts of the same
    # lengths, so that the timed run finds none of its blocks in the prefix cache.
    rng = random.Random(1)
    for p in w.prompts:
        engine.add_request([rng.randrange(1, 256) for _ in p], params)
    while engine.has_unfinished():
        engine.step()
    return engine, params


def mean(values: list[float]) -> float:
    return sum(values) / max(1, len(values))


def run(backend: str, w: Workload, overlap: bool = False) -> dict[str, Any]:
    """One warmed engine, all requests at once, stepped until done."""
    engine, params = warmed(backend, w, overlap)
    prompts = w.prompts
    for p in prompts:
        engine.add_request(p, params)
    t0 = time.perf_counter()
    steps, tokens, forward_ms = 0, 0, 0.0
    decode: list[Durations] = []
    while engine.has_unfinished():
        result = engine.step()
        steps += 1
        tokens += len(result.deltas)
        tel = result.telemetry
        forward_ms += tel.dur_ms.forward
        if tel.batch.num_prefill_tokens == 0:
            decode.append(tel.dur_ms)
    wall = time.perf_counter() - t0
    engine.close()  # stops the compute thread that overlap started
    return {
        "backend": backend,
        "overlap": overlap,
        "model": w.model,
        "requests": len(prompts),
        "output_tokens": tokens,
        "wall_s": wall,
        "tok_per_s": tokens / wall,
        "steps": steps,
        "forward_s": forward_ms / 1e3,
        "forward_share": forward_ms / 1e3 / wall,
        "decode_steps": len(decode),
        "decode_forward_ms": mean([d.forward for d in decode]),
        "decode_host_ms": mean([d.host for d in decode]),
        "decode_hidden_ms": mean([d.hidden for d in decode]),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument(
        "--backends",
        nargs="+",
        default=None,
        choices=["triton", "triton-eager", "torch"],
        help="default: all three (triton and torch with --dry-run)",
    )
    p.add_argument(
        "--overlap",
        nargs="*",
        default=None,
        choices=["triton", "triton-eager", "torch"],
        help="backends that also run with overlap on (default: triton, dry run: torch; "
        "none when given no names)",
    )
    p.add_argument("--model", default=None, help="default: synthetic:gpu-bench (dry run: tiny)")
    p.add_argument("--dry-run", action="store_true", help="synthetic:tiny on the CPU")
    args = p.parse_args(argv)
    w = bench_workload(args.dry_run, args.requests, args.max_tokens, args.max_num_seqs, args.model)
    backends = args.backends or (
        ["triton", "torch"] if args.dry_run else ["triton", "triton-eager", "torch"]
    )
    overlap = ["torch"] if args.dry_run else ["triton"]
    if args.overlap is not None:
        overlap = args.overlap
    arms = [(b, on) for b in backends for on in (False, True) if not on or b in overlap]
    rows, failed = [], []
    for backend, on in arms:
        name = f"{backend}{' overlap' if on else ''}"
        # overlap on CUDA is new: a failed arm leaves the others their runs, then fails the step
        try:
            rows.append(run(backend, w, on))
        except Exception:  # noqa: BLE001 - printed, and raised again below as a failed step
            traceback.print_exc()
            failed.append(name)
            continue
        r = rows[-1]
        print(
            f"engine {name}: {r['output_tokens']} tokens in "
            f"{r['wall_s']:.1f} s = {r['tok_per_s']:.0f} tok/s over {r['steps']} steps, "
            f"forward {r['forward_share']:.0%} of the wall time; decode-only step forward "
            f"{r['decode_forward_ms']:.2f} ms, host {r['decode_host_ms']:.2f} ms "
            f"({r['decode_hidden_ms']:.2f} hidden)",
            flush=True,
        )
        save(args.json, rows)
    if failed:
        raise SystemExit(f"engine runs failed: {', '.join(failed)}")
    return rows


if __name__ == "__main__":
    main()
