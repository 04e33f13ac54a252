"""The `moescope` command line."""

import argparse
import random
import time

from engine import LLM, SamplingParams
from engine.outputs import RequestOutput


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(outputs: list[RequestOutput], wall_s: float) -> str:
    """Throughput and latency percentiles of a finished offline run."""
    tokens = sum(len(o.token_ids) for o in outputs)
    ttft = [o.ttft_s * 1000 for o in outputs if o.ttft_s is not None]
    tpot = [o.tpot_s * 1000 for o in outputs if o.tpot_s is not None]
    lines = [
        f"requests        {len(outputs)}",
        f"output tokens   {tokens}",
        f"wall time       {wall_s:.2f} s",
        f"throughput      {tokens / wall_s:.1f} tok/s",
        "TTFT ms         p50 {:.1f}  p90 {:.1f}  p99 {:.1f}".format(
            *(_percentile(ttft, q) for q in (0.5, 0.9, 0.99))),
        "TPOT ms         p50 {:.2f}  p90 {:.2f}  p99 {:.2f}".format(
            *(_percentile(tpot, q) for q in (0.5, 0.9, 0.99))),
    ]
    return "\n".join(lines)


def cmd_generate(args: argparse.Namespace) -> None:
    llm = LLM(args.model, dtype=args.dtype, num_kv_blocks=args.kv_blocks,
              max_num_seqs=args.max_num_seqs)
    rng = random.Random(args.seed)
    words = ["expert", "token", "router", "batch", "cache", "step", "layer", "prefill"]
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 60)))
               for _ in range(args.num_prompts)]
    params = [SamplingParams(max_tokens=rng.randint(8, args.max_tokens), temperature=0.0,
                             ignore_eos=True) for _ in prompts]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    print(summarize(outputs, time.perf_counter() - start))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="moescope", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="offline generation run with a throughput summary")
    gen.add_argument("--model", default="synthetic:small")
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    gen.add_argument("--num-prompts", type=int, default=64)
    gen.add_argument("--max-tokens", type=int, default=96)
    gen.add_argument("--max-num-seqs", type=int, default=64)
    gen.add_argument("--kv-blocks", type=int, default=2048)
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=cmd_generate)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
