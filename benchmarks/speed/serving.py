"""Online serving: the load generator against `moescope serve` at several rates, and the
telemetry overhead (websocket consumer + /metrics on versus off) as a ratio of step time.

The server runs as a subprocess (its own GIL, like in production); the load generator,
the websocket consumer and the /metrics scraper run here. Mean step time is the engine
loop's own measure (`/api/status` `loop.busy_s / loop.steps`: step, output callbacks and
telemetry publishing), taken over each run. The overhead runs send one burst of
equal requests, so every run schedules the same steps, in alternating off/on pairs.
Writes a section of benchmarks/RESULTS.md.
Run: `python -m benchmarks.speed.serving` (`--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.sync.client import connect

from benchmarks.harness import machine
from benchmarks.harness.results_md import (
    add_results_arguments,
    header,
    percentiles_cell,
    publish,
    results_path,
)
from benchmarks.harness.server_process import healthy
from benchmarks.harness.targets import Target
from cli.loadgen import Arrival, parse_dist, poisson_arrivals, run_load
from engine.ep.ranks import free_port
from stats import percentile

SECTION = "serving"
TARGETS = {
    "overhead": Target("ratio of mean step time, telemetry on / off", 1.03, higher_is_better=False)
}


@contextlib.contextmanager
def server(
    model: str, threads: int, metrics: bool, extra: list[str], db: str | None = None
) -> Iterator[str]:
    """`moescope serve` in a subprocess on a free port, recording into `db` (None: not
    recording); yields its URL."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "cli.main",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--threads",
        str(threads),
        *(["--db", db] if db else ["--no-record"]),
        *extra,
        *([] if metrics else ["--no-metrics"]),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    with healthy(proc, url, "/api/status", 120, lambda: proc.stderr.read() if proc.stderr else ""):
        yield url


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


def parse_args(argv: list[str]) -> argparse.Namespace:
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
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.rates, args.duration, args.pairs = "synthetic:tiny", "4", 1.5, 1
        args.prompt_len, args.output_len = "fixed:16", "fixed:8"
        args.burst, args.burst_prompt, args.burst_output = 4, 16, 32
    return args


SERVER_ARGS = ["--kv-blocks", "2048", "--max-num-seqs", "64"]


def rate_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One load run per rate against one server: the load summary, its rate and step times."""
    prompt, output = parse_dist(args.prompt_len), parse_dist(args.output_len)
    rows = []
    with server(args.model, args.threads, True, SERVER_ARGS) as url:
        for rate in (float(r) for r in args.rates.split(",")):
            arrivals = list(poisson_arrivals(rate, args.duration, prompt, output, args.seed))
            s = {"rate": rate, **measured_run(url, arrivals, args.seed)}
            print(
                f"rate {rate}: {s['output_throughput']:.1f} tok/s, "
                f"TTFT p50 {s['ttft_ms']['p50']} ms",
                file=sys.stderr,
                flush=True,
            )
            rows.append(s)
    return rows


def overhead_run(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """One burst against a fresh server, telemetry consumers on or off; with `on`, what the
    consumers saw (`messages`, `dropped`, `scrapes`)."""
    trace = [Arrival(0.001 * i, args.burst_prompt, args.burst_output) for i in range(args.burst)]
    with server(args.model, args.threads, mode == "on", SERVER_ARGS) as url:
        if mode == "off":
            return measured_run(url, trace, args.seed)
        with Consumers(url, args.scrape_s) as consumers:
            run = measured_run(url, trace, args.seed)
    return {
        **run,
        "messages": consumers.messages,
        "dropped": consumers.dropped,
        "scrapes": consumers.scrapes,
    }


def overhead_runs(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """`--pairs` alternating off / on runs."""
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(args.pairs):
        for mode in ("off", "on"):
            r = overhead_run(args, mode)
            runs[mode].append(r)
            print(
                f"overhead {mode}: mean step {r['mean_step_ms']:.3f} ms "
                f"(cpu {r['mean_step_cpu_ms']:.3f}) over {r['steps']} steps",
                file=sys.stderr,
                flush=True,
            )
    return runs


def overhead(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Mean step time (wall and engine-thread CPU) per mode, and the ratios on / off."""
    out: dict[str, Any] = {"runs": runs}
    for mode, rs in runs.items():
        out[mode] = {
            "wall": statistics.mean(r["mean_step_ms"] for r in rs),
            "cpu": statistics.mean(r["mean_step_cpu_ms"] for r in rs),
        }
    out["ratio"] = out["on"]["wall"] / out["off"]["wall"]
    out["cpu_ratio"] = out["on"]["cpu"] / out["off"]["cpu"]
    out["pair_median"] = percentile(
        (
            b["mean_step_ms"] / a["mean_step_ms"]
            for a, b in zip(runs["off"], runs["on"], strict=True)
        ),
        50,
    )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure and publish; returns the load summary of each rate, the overhead runs and
    ratios, and the target."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.perf_counter()
    rates = rate_runs(args)
    ov = overhead(overhead_runs(args))
    target = TARGETS["overhead"]
    out = {
        "rates": rates,
        "overhead": ov,
        "targets": {"overhead": {"value": ov["ratio"], "met": target.met(ov["ratio"])}},
    }
    section = render(args, argv, out, time.perf_counter() - started)
    publish(SECTION, section, results_path(args))
    return out


def render(args: argparse.Namespace, argv: list[str], out: dict[str, Any], total_s: float) -> str:
    command = ["python", "-m", "benchmarks.speed.serving", *argv]
    lines = [
        header(
            "Online serving (`benchmarks/speed/serving.py`)", command, total_s, machine.measure()
        ),
        f"- Server: `moescope serve --model {args.model} {' '.join(SERVER_ARGS)}` with "
        f"{args.threads} torch thread(s) in a subprocess; the load generator (`cli/loadgen.py`, "
        "open loop, Poisson arrivals, streaming `/v1/completions` with `ignore_eos`, greedy) in "
        "the benchmark process. The cores are shared with other workers, so absolute numbers "
        "are noisy",
        f"- Lengths: prompt `{args.prompt_len}`, output `{args.output_len}` tokens; "
        f"{args.duration:g} s of arrivals per run, seed {args.seed}. TTFT and TPOT are "
        "measured by the client from SSE chunk arrival times (`stats.tpot`; percentiles "
        "`stats.percentile`); mean step is the engine loop's own time per step (step + output "
        "callbacks + telemetry publish).",
        "",
        "| rate req/s | requests (ok) | req/s | out tok/s | TTFT ms p50 / p90 / p99 | "
        "TPOT ms p50 / p90 / p99 | E2E ms p50 / p90 / p99 | steps | mean step ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in out["rates"]:
        lines.append(
            f"| {s['rate']:g} | {s['requests']} ({s['ok']}) | {s['request_throughput']:.2f} | "
            f"{s['output_throughput']:.1f} | {percentiles_cell(s['ttft_ms'], 1)} | "
            f"{percentiles_cell(s['tpot_ms'], 2)} | {percentiles_cell(s['e2e_ms'], 0)} | "
            f"{s['steps']} | {s['mean_step_ms']:.2f} |"
        )
    return "\n".join(lines + ["", *render_overhead(args, out)])


def render_overhead(args: argparse.Namespace, out: dict[str, Any]) -> list[str]:
    ov = out["overhead"]
    on = ov["runs"]["on"]
    msgs, drops, scrapes = (sum(r[k] for r in on) for k in ("messages", "dropped", "scrapes"))

    def row(mode: str) -> str:
        walls = " / ".join(f"{r['mean_step_ms']:.3f}" for r in ov["runs"][mode])
        steps = "/".join(str(r["steps"]) for r in ov["runs"][mode])
        return f"| {mode} | {walls} | {ov[mode]['wall']:.3f} | {ov[mode]['cpu']:.3f} | {steps} |"

    ratio = ov["ratio"]
    return [
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
        row("off"),
        row("on"),
        "",
        f"Ratio of mean step time on / off: **{ratio:.3f}** ({(ratio - 1) * 100:+.1f}%; "
        f"median of the per-pair ratios {ov['pair_median']:.3f}; "
        f"engine-thread CPU {ov['cpu_ratio']:.3f}).",
        "",
        "Targets:",
        "",
        TARGETS["overhead"].line(ratio, f"{ratio:.3f}"),
    ]


if __name__ == "__main__":
    main()
