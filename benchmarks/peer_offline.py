"""One offline run for `peer_llamacpp.py`: the engine `moescope serve` runs there, with the
same flags, driven in process (`LLMEngine`, every request added at once, stepped until done)
in a fresh process, as each server is. Prints its counts and times as one JSON line.
Run by `peer_llamacpp.py`; by hand: `python benchmarks/peer_offline.py MODEL --dtype float32`.
"""

import argparse
import json
import sys

from offline_runners import make_workload, run_ours, warm_ours
from peer_llamacpp import OUTPUT_RANGE, PROMPT_RANGE, busy_cpu

from engine import LLMEngine


def main(argv: list[str]) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--kv-blocks", type=int, default=2048)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    engine = LLMEngine(
        model=args.model,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        num_kv_blocks=args.kv_blocks,
        threads=args.threads,
    )
    vocab = engine.model_config.vocab_size
    wl = make_workload(args.requests, args.seed, vocab, PROMPT_RANGE, OUTPUT_RANGE)
    warm_ours(engine, vocab)
    busy0 = busy_cpu()
    run = run_ours(engine, wl, "offline", "")
    return {
        "wall_s": run.wall_s,
        "tokens": run.num_tokens,
        "cpu_s": run.cpu_s,
        "others_cpu_s": max(0.0, busy_cpu() - busy0 - run.cpu_s),
        "steps": run.extra["steps"],
        "busy_s": run.extra["dur_s"]["total"],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
