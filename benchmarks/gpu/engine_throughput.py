"""The offline engine on a larger synthetic model, on the GPU in bf16, per backend.

    python -m benchmarks.gpu.engine_throughput --json engine.json [--dry-run] [--model M]

All requests arrive at once (seeded random prompts, greedy, EOS ignored). The engine runs
on the Triton backends with decode CUDA graphs (`triton`), without them (`triton-eager`,
MOESCOPE_DECODE_GRAPHS=0) and on the torch backends (`torch`; MOESCOPE_MOE_BACKEND and
MOESCOPE_ATTN_BACKEND); each run reports output tokens per second, steps, and the mean
forward time of decode-only steps. The model is a synthetic preset registered here, wider
than the engine's own presets (see LARGE), unless --model names another (run_all.sh also runs
synthetic:dsv2-lite, whose MLA decodes in the graphs too).
"""

import argparse
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.gpu.bench_util import pick_device, save

if TYPE_CHECKING:
    from engine import LLMEngine, SamplingParams

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


def warmed(backend: str, w: Workload) -> tuple["LLMEngine", "SamplingParams"]:
    """An engine on `backend` that has run a workload of the same lengths once, and the
    sampling parameters to run `w.prompts` with."""
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


def run(backend: str, w: Workload) -> dict[str, Any]:
    """One warmed engine, all requests at once, stepped until done."""
    engine, params = warmed(backend, w)
    prompts = w.prompts
    for p in prompts:
        engine.add_request(p, params)
    t0 = time.perf_counter()
    steps, tokens, decode_ms = 0, 0, []
    while engine.has_unfinished():
        result = engine.step()
        steps += 1
        tokens += len(result.deltas)
        tel = result.telemetry
        if tel.batch.num_prefill_tokens == 0:
            decode_ms.append(tel.dur_ms.forward)
    wall = time.perf_counter() - t0
    return {
        "backend": backend,
        "model": w.model,
        "requests": len(prompts),
        "output_tokens": tokens,
        "wall_s": wall,
        "tok_per_s": tokens / wall,
        "steps": steps,
        "decode_steps": len(decode_ms),
        "decode_forward_ms": sum(decode_ms) / max(1, len(decode_ms)),
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
    p.add_argument("--model", default=None, help="default: synthetic:gpu-bench (dry run: tiny)")
    p.add_argument("--dry-run", action="store_true", help="synthetic:tiny on the CPU")
    args = p.parse_args(argv)
    w = bench_workload(args.dry_run, args.requests, args.max_tokens, args.max_num_seqs, args.model)
    backends = args.backends or (
        ["triton", "torch"] if args.dry_run else ["triton", "triton-eager", "torch"]
    )
    rows = []
    for backend in backends:
        rows.append(run(backend, w))
        r = rows[-1]
        print(
            f"engine {backend}: {r['output_tokens']} tokens in {r['wall_s']:.1f} s = "
            f"{r['tok_per_s']:.0f} tok/s over {r['steps']} steps; decode-only step forward "
            f"{r['decode_forward_ms']:.2f} ms",
            flush=True,
        )
        save(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
