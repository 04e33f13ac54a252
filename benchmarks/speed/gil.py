"""The engine thread beside a busy Python thread: why the server's simulations run in a
child process (server/analysis.py).

The engine thread lets the GIL go at every torch operation and takes it back after. While
another thread of the same process runs Python, every take waits out the switch interval.
Arms, in alternating rounds on one engine (synthetic:small, 1 thread, 16 requests of 64
prompt tokens decoding 32): quiet; a pure-Python busy thread at the default switch interval
(5 ms) and at 0.5 ms; the same busy loop in a child process at nice 10 (what the autopilot
does now). Cells: median decode step ms per round. Writes its section of RESULTS.md.

    python -m benchmarks.speed.gil            # --quick for a smoke run (writes nothing)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.speed.offline_runners import ours_decode_ms
from engine.engine import LLMEngine

SECTION = "gil"
BATCH, PROMPT, TOKENS = 16, 64, 32


def spin(stop: Callable[[], bool]) -> None:
    x = 0
    while not stop():
        for i in range(1000):
            x += i


def _child_spin() -> None:
    os.nice(10)
    spin(lambda: False)


@contextmanager
def busy_thread(interval_s: float) -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    done = threading.Event()
    thread = threading.Thread(target=spin, args=(done.is_set,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(old)


@contextmanager
def busy_child() -> Iterator[None]:
    proc = multiprocessing.get_context("spawn").Process(target=_child_spin, daemon=True)
    proc.start()
    try:
        yield
    finally:
        proc.kill()
        proc.join()


@contextmanager
def quiet() -> Iterator[None]:
    yield


ARMS: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "quiet": quiet,
    "busy Python thread, switch interval 5 ms": lambda: busy_thread(0.005),
    "busy Python thread, switch interval 0.5 ms": lambda: busy_thread(0.0005),
    "busy Python in a child process (nice 10)": busy_child,
}


def measure(rounds: int, tokens: int) -> dict[str, list[float]]:
    engine = LLMEngine(model="synthetic:small", threads=1, max_num_seqs=BATCH)
    ours_decode_ms(engine, BATCH, PROMPT, 4)  # warm-up
    out: dict[str, list[float]] = {name: [] for name in ARMS}
    for r in range(rounds):
        names = list(ARMS)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            with ARMS[name]():
                out[name].append(ours_decode_ms(engine, BATCH, PROMPT, tokens))
            print(f"round {r + 1}: {name}: {out[name][-1]:.1f} ms", flush=True)
    return out


def render(ms: dict[str, list[float]], argv: list[str], seconds: float) -> str:
    base = statistics.median(ms["quiet"])
    lines = [
        header(
            "The engine beside a busy Python thread (`benchmarks/speed/gil.py`)",
            ["python", "-m", "benchmarks.speed.gil", *argv],
            seconds,
            machine.measure(),
        ),
        f"- Engine: synthetic:small, 1 intra-op thread, {BATCH} requests of {PROMPT} prompt "
        "tokens decoding together; a cell is the median decode step of a round",
        "",
        "| arm | median decode step ms (each round) | over quiet |",
        "| --- | --- | --- |",
    ]
    for name, values in ms.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        lines.append(
            f"| {name} | {statistics.median(values):.1f} ({each}) | "
            f"{statistics.median(values) / base:.2f}x |"
        )
    lines += [
        "",
        "Reading: the engine thread releases the GIL at every torch operation; a Python thread "
        "of the same process that keeps running takes it, and the engine waits up to the switch "
        "interval to get it back, hundreds of times a step. So the server runs its "
        "simulations (what-ifs, the scorecard's predictions, the autopilot's twin) in a child "
        "process (`server/analysis.py`): the same busy loop there costs the engine only its share "
        "of the cores.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1 round, few tokens")
    add_results_arguments(p)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    ms = measure(1, 3) if args.quick else measure(args.rounds, TOKENS)
    publish(SECTION, render(ms, argv, time.perf_counter() - t0), results_path(args))
    return ms


if __name__ == "__main__":
    main()
