"""One offline run for `llamacpp.py`: the engine `moescope serve` runs there, with the
same flags, driven in process in a fresh process, as each server is. Prints its counts and
times as one JSON line. `--via steps` (the default) adds every request at once and steps
the engine on the main thread until done; `--via loop` submits them to an `EngineLoop` built
on its own thread, as `moescope serve` does, without HTTP (`serve_overhead.py`'s middle arm).
By hand: `python -m benchmarks.peer.offline MODEL --dtype float32`.
"""

import argparse
import json
import sys
import threading

from api.launch import build_loop
from benchmarks.peer.runs import OUTPUT_RANGE, PROMPT_RANGE, busy_cpu
from benchmarks.speed.offline_runners import (
    Workload,
    make_workload,
    run_ours,
    timed,
    warm_ours,
    warm_workload,
)
from engine import LLMEngine, RequestDelta, RequestOutput, SamplingParams
from engine.loop import EngineLoop


def main(argv: list[str]) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--kv-blocks", type=int, default=2048)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--via", choices=["steps", "loop"], default="steps")
    p.add_argument("--overlap", action="store_true", help="the engine's overlapped steps")
    args = p.parse_args(argv)
    flags = dict(
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        num_kv_blocks=args.kv_blocks,
        threads=args.threads,
        overlap=args.overlap,
    )
    if args.via == "loop":
        return through_loop(build_loop(args.model, **flags), args)
    engine = LLMEngine(model=args.model, **flags)
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


def through_loop(loop: EngineLoop, args: argparse.Namespace) -> dict[str, float]:
    """The workload submitted at once to the started `loop`, after the same warm-up."""
    loop.start()
    try:
        vocab = loop.engine.model_config.vocab_size
        submit_all(loop, warm_workload(vocab))
        wl = make_workload(args.requests, args.seed, vocab, PROMPT_RANGE, OUTPUT_RANGE)
        steps0, busy_s0, busy0 = loop.steps, loop.busy_s, busy_cpu()
        with timed() as spent:
            tokens = submit_all(loop, wl)
        return {
            "wall_s": spent["wall"],
            "tokens": tokens,
            "cpu_s": spent["cpu"],
            "others_cpu_s": max(0.0, busy_cpu() - busy0 - spent["cpu"]),
            "steps": loop.steps - steps0,
            "busy_s": loop.busy_s - busy_s0,
        }
    finally:
        loop.stop()


def submit_all(loop: EngineLoop, wl: Workload) -> int:
    """Every request of `wl` submitted at once; waits for the last to finish and returns the
    output tokens (each request's count checked)."""
    ended: dict[str, RequestOutput] = {}
    done = threading.Event()

    def on_output(delta: RequestDelta) -> None:
        if delta.output is not None:
            ended[delta.request_id] = delta.output
            if len(ended) == len(wl):
                done.set()

    ids = [
        loop.submit(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), on_output)
        for p, n in zip(wl.prompts, wl.max_tokens, strict=True)
    ]
    while not done.wait(1.0):
        if not loop.alive:
            raise RuntimeError(loop.error or "the engine loop stopped")
    counts = [len(ended[i].token_ids) for i in ids]
    if counts != wl.max_tokens:
        raise RuntimeError("a request ended with a wrong token count")
    return sum(counts)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
