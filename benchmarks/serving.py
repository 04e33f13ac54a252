"""Online serving: the load generator against `moescope serve` at several rates, and the
telemetry overhead (websocket consumer + /metrics on versus off) as a ratio of step time.

The server runs as a subprocess (its own GIL, like in production); the load generator,
the websocket consumer and the /metrics scraper run here. Mean step time is the engine
loop's own measure (`/api/status` `loop.busy_s / loop.steps`: step, output callbacks and
telemetry publishing), taken over each run. The overhead runs send one burst of
equal requests, so every run schedules the same steps, in alternating off/on pairs.
Writes a section of benchmarks/RESULTS.md.
Run: `python benchmarks/serving.py` (`--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
from results_md import write_section
from websockets.sync.client import connect

from api.loadgen import Arrival, parse_dist, poisson_arrivals, run_load
from engine.ep.ranks import free_port

RESULTS_PATH = Path(__file__).resolve().parent / "RESULTS.md"
BEGIN = "<!-- serving:begin -->"
END = "<!-- serving:end -->"


@contextlib.contextmanager
def server(model: str, threads: int, metrics: bool, extra: list[str]) -> Iterator[str]:
    """`moescope serve` in a subprocess on a free port; yields its URL."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "api.cli",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--no-record",
        *extra,
        *([] if metrics else ["--no-metrics"]),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/api/status", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Consumers:
    """A websocket client reading every step and a /metrics scraper, on threads."""

    url: str
    scrape_s: float
    messages: int = 0
    dropped: int = 0
    scrapes: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _ws(self) -> None:
        with connect(self.url.replace("http", "ws") + "/ws/telemetry", max_queue=None) as ws:
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    msg = json.loads(ws.recv(timeout=0.2))
                    self.messages += 1
                    self.dropped += msg.get("dropped", 0)

    def _scrape(self) -> None:
        while not self._stop.wait(self.scrape_s):
            httpx.get(self.url + "/metrics", timeout=10).raise_for_status()
            self.scrapes += 1

    def __enter__(self) -> Consumers:
        self._threads = [
            threading.Thread(target=self._ws, daemon=True),
            threading.Thread(target=self._scrape, daemon=True),
        ]
        for t in self._threads:
            t.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


def _loop_status(url: str) -> dict[str, Any]:
    return httpx.get(url + "/api/status", timeout=10).json()["loop"]


def measured_run(url: str, arrivals: list[Arrival], seed: int) -> dict[str, Any]:
    """One load run; adds the engine's mean step time and step count over the run."""
    before = _loop_status(url)
    summary = asyncio.run(run_load(url, arrivals, seed=seed))
    after = _loop_status(url)
    steps = after["steps"] - before["steps"]
    busy = after["busy_s"] - before["busy_s"]
    cpu = after["busy_cpu_s"] - before["busy_cpu_s"]
    summary["steps"] = steps
    summary["mean_step_ms"] = 1000 * busy / steps if steps else float("nan")
    summary["mean_step_cpu_ms"] = 1000 * cpu / steps if steps else float("nan")
    return summary


def _pcts(p: dict[str, float], digits: int) -> str:
    return " / ".join(f"{p[k]:.{digits}f}" for k in ("p50", "p90", "p99"))


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic:small")
    p.add_argument("--rates", default="1,2,4", help="comma-separated requests per second")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per run")
    p.add_argument("--prompt-len", default="uniform:16:256")
    p.add_argument("--output-len", default="uniform:16:128")
    p.add_argument("--burst", type=int, default=16, help="requests of each overhead run")
    p.add_argument("--burst-prompt", type=int, default=64)
    p.add_argument("--burst-output", type=int, default=256)
    p.add_argument("--pairs", type=int, default=6, help="off/on pairs for the overhead")
    p.add_argument("--scrape-s", type=float, default=1.0, help="/metrics scrape period")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="synthetic:tiny, short runs")
    p.add_argument("--results", type=Path, default=RESULTS_PATH)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.rates, args.duration, args.pairs = "synthetic:tiny", "4", 1.5, 1
        args.prompt_len, args.output_len = "fixed:16", "fixed:8"
        args.burst, args.burst_prompt, args.burst_output = 4, 16, 32
    prompt, output = parse_dist(args.prompt_len), parse_dist(args.output_len)
    extra = ["--kv-blocks", "2048", "--max-num-seqs", "64"]
    started = time.perf_counter()

    rate_rows = []
    with server(args.model, args.threads, True, extra) as url:
        for rate in (float(r) for r in args.rates.split(",")):
            arrivals = list(poisson_arrivals(rate, args.duration, prompt, output, args.seed))
            s = measured_run(url, arrivals, args.seed)
            print(
                f"rate {rate}: {s['output_throughput']:.1f} tok/s, "
                f"TTFT p50 {s['ttft_ms']['p50']:.1f} ms",
                file=sys.stderr,
                flush=True,
            )
            rate_rows.append((rate, s))

    trace = [Arrival(0.001 * i, args.burst_prompt, args.burst_output) for i in range(args.burst)]
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    consumer_stats = []
    for _ in range(args.pairs):
        for mode in ("off", "on"):
            with server(args.model, args.threads, mode == "on", extra) as url:
                if mode == "off":
                    runs[mode].append(measured_run(url, trace, args.seed))
                else:
                    with Consumers(url, args.scrape_s) as consumers:
                        runs[mode].append(measured_run(url, trace, args.seed))
                    consumer_stats.append(
                        (consumers.messages, consumers.dropped, consumers.scrapes)
                    )
            r = runs[mode][-1]
            print(
                f"overhead {mode}: mean step {r['mean_step_ms']:.3f} ms "
                f"(cpu {r['mean_step_cpu_ms']:.3f}) over {r['steps']} steps",
                file=sys.stderr,
                flush=True,
            )

    section = render(args, argv, rate_rows, runs, consumer_stats, time.perf_counter() - started)
    print(section)
    write_section(args.results, section, BEGIN, END)
    return section


def render(
    args: argparse.Namespace,
    argv: list[str] | None,
    rate_rows: list[tuple[float, dict]],
    runs: dict[str, list[dict[str, Any]]],
    consumer_stats: list[tuple[int, int, int]],
    total_s: float,
) -> str:
    command = "python benchmarks/serving.py" + (" " + shlex.join(argv) if argv else "")
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        "## Online serving (`benchmarks/serving.py`)",
        "",
        f"- Command: `{command}`",
        f"- Date: {now}; total runtime {total_s / 60:.1f} min",
        f"- Machine: {len(os.sched_getaffinity(0))} CPU cores, shared with other "
        f"workers (absolute numbers are noisy); torch {torch.__version__} with "
        f"{args.threads} thread(s) in the server, Python {platform.python_version()}",
        f"- Server: `moescope serve --model {args.model} --kv-blocks 2048 --max-num-seqs 64` "
        "in a subprocess; the load generator (`api/loadgen.py`, open loop, Poisson arrivals, "
        "streaming `/v1/completions` with `ignore_eos`, greedy) in the benchmark process",
        f"- Lengths: prompt `{args.prompt_len}`, output `{args.output_len}` tokens; "
        f"{args.duration:g} s of arrivals per run, seed {args.seed}. TTFT and TPOT are "
        "measured by the client from SSE chunk arrival times; mean step is the engine "
        "loop's own time per step (step + output callbacks + telemetry publish).",
        "",
        "| rate req/s | requests (ok) | req/s | out tok/s | TTFT ms p50 / p90 / p99 | "
        "TPOT ms p50 / p90 / p99 | E2E ms p50 / p90 / p99 | steps | mean step ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rate, s in rate_rows:
        lines.append(
            f"| {rate:g} | {s['requests']} ({s['ok']}) | {s['request_throughput']:.2f} | "
            f"{s['output_throughput']:.1f} | {_pcts(s['ttft_ms'], 1)} | "
            f"{_pcts(s['tpot_ms'], 2)} | {_pcts(s['e2e_ms'], 0)} | {s['steps']} | "
            f"{s['mean_step_ms']:.2f} |"
        )

    def col(mode: str, key: str) -> list[float]:
        return [r[key] for r in runs[mode]]

    off, on = col("off", "mean_step_ms"), col("on", "mean_step_ms")
    off_cpu, on_cpu = col("off", "mean_step_cpu_ms"), col("on", "mean_step_cpu_ms")
    pair_ratios = [b / a for a, b in zip(off, on, strict=True)]
    cpu_ratio = statistics.mean(on_cpu) / statistics.mean(off_cpu)
    ratio = statistics.mean(on) / statistics.mean(off)
    msgs = sum(m for m, _, _ in consumer_stats)
    drops = sum(d for _, d, _ in consumer_stats)
    scrapes = sum(s for _, _, s in consumer_stats)

    def row(mode: str, wall: list[float], cpu: list[float]) -> str:
        steps = "/".join(str(r["steps"]) for r in runs[mode])
        return (
            f"| {mode} | {' / '.join(f'{x:.3f}' for x in wall)} | "
            f"{statistics.mean(wall):.3f} | {statistics.mean(cpu):.3f} | {steps} |"
        )

    lines += [
        "",
        f"Telemetry overhead: {args.pairs} alternating pairs of runs, each a fresh server and "
        f"one burst of {args.burst} requests (prompt {args.burst_prompt}, output "
        f"{args.burst_output} tokens) that arrive together, so every run schedules the same "
        "steps. Off: `--no-metrics` and no websocket client (the loop then skips building the "
        f"record dict). On: /metrics with its bus consumer, scraped every {args.scrape_s:g} s, "
        f"plus one websocket client reading every step ({msgs} messages, {drops} dropped, "
        f"{scrapes} scrapes in all). CPU is the engine thread's own CPU time per step "
        "(`time.thread_time`), which other processes on the machine disturb less than wall "
        "time.",
        "",
        "| telemetry | mean step ms per run (wall) | mean wall | mean engine-thread CPU | "
        "steps per run |",
        "| --- | --- | --- | --- | --- |",
        row("off", off, off_cpu),
        row("on", on, on_cpu),
        "",
        f"Ratio of mean step time on / off: **{ratio:.3f}** ({(ratio - 1) * 100:+.1f}%; "
        f"median of the per-pair ratios {statistics.median(pair_ratios):.3f}; "
        f"engine-thread CPU {cpu_ratio:.3f}). Target: under 3%.",
        END,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
