"""Dashboard stream and render cost with the engine publishing >= 100 steps/s.

A real server (api.server.ServerThread) around synthetic:tiny is kept busy with small
requests (prompt 8, 16 output tokens, 8 running), so it steps several hundred times a second.
1. Lag: a separate process (like a dashboard, niced as `moescope dashboard` runs it) runs
   the dashboard's TelemetryStream for `--lag-s` seconds, sampling the time since its newest
   frame was produced (`now - frame t`) and the step it has reached against the server's
   step, every 0.25 s. Keeping up means the lag in the last quarter is no larger than in the
   first.
2. Render: the stream's last 600 real frames go into a StepWindow one by one (as the live
   page's stream does when they arrive; timed per frame), then a refresh is the window's
   view, every chart function (`charts.live_figures`) and each figure's JSON as
   st.plotly_chart makes it; median of `--repeats` refreshes.
3. Overhead: mean engine step time (the loop's `busy_s / steps`) in rotated blocks with no
   consumer (twice: an A/A control), three streams taking one message a step, three streams
   in bundles, and three bundled streams at the dashboard's CPU priority (as `moescope
   dashboard` runs), all in one run; with the CPU the server thread and the consumer process
   spend per step.
Each measure's target is in TARGETS. Writes a section of benchmarks/RESULTS.md.
Run: `python benchmarks/dashboard_bench.py` (`--quick` for a smoke run, `--no-write` to leave
RESULTS.md alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import plotly.io
import plotly.tools
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import machine  # noqa: E402
from results_md import add_results_arguments, header, publish, results_path  # noqa: E402
from targets import Target  # noqa: E402

from api.app import create_app  # noqa: E402
from api.server import ServerThread, build_loop  # noqa: E402
from api.settings import ServerSettings  # noqa: E402
from dashboard import charts  # noqa: E402
from dashboard.__main__ import NICE  # noqa: E402
from dashboard.client import LIVE_PATH, ws_url  # noqa: E402
from dashboard.stream import CONNECTED, TelemetryStream  # noqa: E402
from dashboard.window import StepWindow  # noqa: E402
from engine import SamplingParams  # noqa: E402
from engine.loop import EngineLoop  # noqa: E402
from stats import percentile  # noqa: E402

SECTION = "dashboard"
MODEL = "synthetic:tiny"
RUNNING = 8
DASHBOARD = f"3 consumers, bundled, at the dashboard's priority (nice {NICE})"
MODES: dict[str, tuple[str, int] | None] = {  # name: (path, niceness) of the consumers
    "none": None,
    "none again (A/A control)": None,
    "3 consumers, one message a step": ("/ws/telemetry", 0),
    "3 consumers, bundled": (LIVE_PATH, 0),
    DASHBOARD: (LIVE_PATH, NICE),
}
TARGETS = {
    "steps_per_s": Target("engine steps/s seen by the stream", 100),
    # keeping up: the lag of the last quarter at most this much above the first's (ms)
    "lag_growth_ms": Target("lag growth, last quarter - first (ms)", 50, higher_is_better=False),
    "dropped": Target("steps dropped for the stream", 0, higher_is_better=False),
    "render_ms": Target("render one refresh (ms, median)", 200, higher_is_better=False),
    "overhead": Target(
        "ratio of mean step time, dashboard consumers / none", 1.03, higher_is_better=False
    ),
}


class Traffic:
    """Keeps about RUNNING small requests in the engine until stopped."""

    def __init__(self, loop: EngineLoop) -> None:
        self.loop = loop
        self.done = threading.Semaphore(RUNNING)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        i = 0
        while not self._stop.is_set():
            if not self.done.acquire(timeout=0.1):
                continue
            i += 1

            def on_out(out: Any) -> None:
                if getattr(out, "finished", False):
                    self.done.release()

            self.loop.submit([256, *range(1 + i % 50, 8 + i % 50)], params, on_out)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


SAMPLE_GRACE_S = 60.0  # how long a consumer may wait past its time for two samples


def consumer(url: str, path: str, nice: int, n: int, seconds: float, out: str) -> None:
    """The child process (at `nice`): `n` dashboard streams of `path` for `seconds`; samples
    of stream 0 and its last frames go to `out` as JSON."""
    if nice:
        os.nice(nice)
    streams = [
        TelemetryStream(ws_url(url, path), maxlen=600, window=StepWindow(600)).start()
        for _ in range(n)
    ]
    deadline = time.monotonic() + 10
    while any(s.state != CONNECTED for s in streams) and time.monotonic() < deadline:
        time.sleep(0.01)
    print("connected", flush=True)
    samples: list[dict[str, Any]] = []
    end = time.monotonic() + seconds
    # a niced child on a busy machine may see no frame for a while: sample on until it has
    # two (a rate needs two), up to SAMPLE_GRACE_S more
    while time.monotonic() < end or (len(samples) < 2 and time.monotonic() < end + SAMPLE_GRACE_S):
        time.sleep(0.25)
        frames = streams[0].frames()
        if frames:
            samples.append(
                {
                    "now": time.time(),
                    "step": frames[-1]["step"],
                    "lag_s": time.time() - frames[-1]["t"],
                    "received": streams[0].received,
                }
            )
    result = {
        "samples": samples,
        "frames": streams[0].frames(),
        "dropped": [s.dropped for s in streams],
        "received": [s.received for s in streams],
    }
    for s in streams:
        s.stop()
    Path(out).write_text(json.dumps(result))


def spawn(
    url: str, n: int, seconds: float, out: str, path: str = LIVE_PATH, nice: int = NICE
) -> subprocess.Popen[str]:
    """A consumer process, by default as `moescope dashboard` runs: bundled, niced."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--consumer", url, path, str(nice), str(n), str(seconds), out],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "connected"
    return proc


def lag_run(url: str, loop: EngineLoop, seconds: float, tmp: str) -> dict[str, Any]:
    """One consumer process for `seconds`: its steps/s, lag samples and last frames."""
    out = os.path.join(tmp, "lag.json")
    steps0 = loop.steps
    t0 = time.monotonic()
    spawn(url, 1, seconds, out).wait(timeout=seconds + SAMPLE_GRACE_S + 30)
    server_rate = (loop.steps - steps0) / (time.monotonic() - t0)
    res = json.loads(Path(out).read_text())
    samples = res["samples"]
    q = max(1, len(samples) // 4)
    first, last = samples[:q], samples[-q:]
    span = samples[-1]["now"] - samples[0]["now"] if len(samples) > 1 else 0.0
    rate = (samples[-1]["step"] - samples[0]["step"]) / span if span else 0.0
    for s in samples:  # steps the server made since the newest received one, at this rate
        s["step_lag"] = s["lag_s"] * rate
    return {
        "seconds": seconds,
        "steps_per_s": rate,
        "server_steps_per_s": server_rate,
        "samples": len(samples),
        "dropped": res["dropped"][0],
        "lag_ms_first": 1000 * statistics.mean(s["lag_s"] for s in first),
        "lag_ms_last": 1000 * statistics.mean(s["lag_s"] for s in last),
        "lag_ms_max": 1000 * max(s["lag_s"] for s in samples),
        "step_lag_first": statistics.mean(s["step_lag"] for s in first),
        "step_lag_last": statistics.mean(s["step_lag"] for s in last),
        "step_lag_max": max(s["step_lag"] for s in samples),
        "frames": res["frames"],
    }


def render_run(frames: list[dict[str, Any]], repeats: int) -> dict[str, float]:
    """What the live page does: each frame into a StepWindow as it arrives (timed per frame),
    then per refresh the window's view of 600 steps, every chart, and each chart's JSON as
    st.plotly_chart makes it."""
    window = StepWindow(600)
    t0 = time.perf_counter()
    for frame in frames:
        window.add(frame)
    ingest_us = 1e6 * (time.perf_counter() - t0) / max(len(frames), 1)
    build, full = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        figs = charts.live_figures(window.view(600))
        t1 = time.perf_counter()
        for f in figs.values():  # what st.plotly_chart does with a figure
            plotly.io.to_json(
                plotly.tools.return_figure_from_figure_or_data(f, True), validate=False
            )
        t2 = time.perf_counter()
        build.append(1000 * (t1 - t0))
        full.append(1000 * (t2 - t0))
    return {
        "frames": len(frames),
        "panels": len(figs),
        "ingest_us": ingest_us,
        "build_ms": percentile(build, 50),
        "build_json_ms": percentile(full, 50),
        "build_ms_max": max(build),
        "build_json_ms_max": max(full),
    }


def _cpu_s(server: ServerThread, proc: subprocess.Popen[str] | None) -> tuple[float, float]:
    """CPU seconds so far of the server's thread and of the consumer process (0 without)."""
    assert server.thread.ident is not None
    thread = time.clock_gettime(time.pthread_getcpuclockid(server.thread.ident))
    if proc is None:
        return thread, 0.0
    times = psutil.Process(proc.pid).cpu_times()
    return thread, times.user + times.system


def _block(
    loop: EngineLoop, server: ServerThread, proc: subprocess.Popen[str] | None, seconds: float
) -> dict[str, float]:
    """Per engine step over `seconds`: wall and engine-thread CPU ms of the step, and the CPU
    ms the server thread and the consumer process spent meanwhile."""
    b0, c0, s0 = loop.busy_s, loop.busy_cpu_s, loop.steps
    server0, consumer0 = _cpu_s(server, proc)
    time.sleep(seconds)
    server1, consumer1 = _cpu_s(server, proc)
    n = max(loop.steps - s0, 1)
    return {
        "wall": 1000 * (loop.busy_s - b0) / n,
        "cpu": 1000 * (loop.busy_cpu_s - c0) / n,
        "server": 1000 * (server1 - server0) / n,
        "consumer": 1000 * (consumer1 - consumer0) / n,
    }


def overhead_run(
    url: str, loop: EngineLoop, server: ServerThread, rounds: int, block_s: float, tmp: str
) -> dict[str, Any]:
    """Blocks of each mode (MODES), in an order rotated every round; per-mode means and
    ratios to `none`, and the median over rounds of each round's ratio."""
    blocks: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    names = list(MODES)
    for r in range(rounds):
        for mode in names[r % len(names) :] + names[: r % len(names)]:
            kind = MODES[mode]
            proc = (
                None
                if kind is None
                else spawn(url, 3, block_s + 1.0, os.path.join(tmp, f"{r}.json"), *kind)
            )
            time.sleep(0.3)
            blocks[mode].append(_block(loop, server, proc, block_s))
            if proc is not None:
                proc.wait(timeout=30)
    out: dict[str, Any] = {"rounds": rounds, "block_s": block_s, "blocks": blocks}
    none = blocks["none"]
    for mode, bs in blocks.items():
        mean = {k: statistics.mean(b[k] for b in bs) for k in bs[0]}
        mean["ratio"] = mean["wall"] / statistics.mean(b["wall"] for b in none)
        mean["cpu_ratio"] = mean["cpu"] / statistics.mean(b["cpu"] for b in none)
        mean["pair_median"] = percentile(
            (b["wall"] / a["wall"] for a, b in zip(none, bs, strict=True)), 50
        )
        out[mode] = mean
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    loop = build_loop(MODEL, num_kv_blocks=256, max_num_seqs=RUNNING, max_num_batched_tokens=256)
    server = ServerThread(create_app(loop, ServerSettings(model_name=MODEL))).start()
    try:
        with Traffic(loop), tempfile.TemporaryDirectory() as tmp:
            time.sleep(0.5)
            lag = lag_run(server.url, loop, args.lag_s, tmp)
            render = render_run(lag.pop("frames")[-600:], args.repeats)
            overhead = overhead_run(server.url, loop, server, args.rounds, args.block_s, tmp)
    finally:
        server.stop()
        loop.stop()
    return {"lag": lag, "render": render, "overhead": overhead}


def check_targets(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each TARGETS entry: its measured value and whether it is met."""
    lag = res["lag"]
    values = {
        "steps_per_s": lag["steps_per_s"],
        "lag_growth_ms": lag["lag_ms_last"] - lag["lag_ms_first"],
        "dropped": lag["dropped"],
        "render_ms": res["render"]["build_json_ms"],
        "overhead": res["overhead"][DASHBOARD]["ratio"],
    }
    return {k: {"value": v, "met": TARGETS[k].met(v)} for k, v in values.items()}


def measure_rows(res: dict[str, Any], checks: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(measure, value, target, met) rows of the section's first table."""
    lag, ren, ov = res["lag"], res["render"], res["overhead"]
    bundled, aa = ov[DASHBOARD], ov["none again (A/A control)"]

    def target(key: str) -> tuple[str, str]:
        return TARGETS[key].bound, "yes" if checks[key]["met"] else "no"

    return [
        ("engine steps/s seen by the stream", f"{lag['steps_per_s']:.0f}", *target("steps_per_s")),
        (
            "lag, first / last quarter (ms)",
            f"{lag['lag_ms_first']:.1f} / {lag['lag_ms_last']:.1f} (max {lag['lag_ms_max']:.1f})",
            f"last - first {TARGETS['lag_growth_ms'].bound}",
            target("lag_growth_ms")[1],
        ),
        (
            "engine steps/s (loop counter, incl. startup of the consumer)",
            f"{lag['server_steps_per_s']:.0f}",
            "–",
            "–",
        ),
        (
            "lag in steps (lag × steps/s), first / last quarter",
            f"{lag['step_lag_first']:.2f} / "
            f"{lag['step_lag_last']:.2f} (max {lag['step_lag_max']:.2f})",
            "–",
            "–",
        ),
        ("steps dropped for the stream", str(lag["dropped"]), *target("dropped")),
        (
            f"render one refresh of {ren['frames']} steps, {ren['panels']} panels: view, charts "
            "and their JSON as st.plotly_chart makes it (ms, median)",
            f"{ren['build_json_ms']:.1f} (max {ren['build_json_ms_max']:.1f})",
            *target("render_ms"),
        ),
        (
            "… of which view and chart functions (ms, median)",
            f"{ren['build_ms']:.1f} (max {ren['build_ms_max']:.1f})",
            "–",
            "–",
        ),
        (
            "frames into the StepWindow as they arrive (µs per frame, stream thread)",
            f"{ren['ingest_us']:.1f}",
            "–",
            "–",
        ),
        (
            "ratio of mean step time, 3 dashboard consumers (bundled, niced) / none",
            f"{bundled['ratio']:.3f} "
            f"(median of the rounds' ratios {bundled['pair_median']:.3f}; engine-thread CPU "
            f"{bundled['cpu_ratio']:.3f})",
            *target("overhead"),
        ),
        (
            "… the same ratio for two runs of none (A/A: the noise of this machine)",
            f"{aa['ratio']:.3f} (median of the rounds' ratios {aa['pair_median']:.3f})",
            "–",
            "–",
        ),
    ]


def render_section(res: dict[str, Any], argv: list[str], runtime_s: float) -> str:
    lag, ov = res["lag"], res["overhead"]
    aa = ov["none again (A/A control)"]
    fanout_ms = ov[DASHBOARD]["server"] - ov["none"]["server"]
    fanout_pct = 100 * fanout_ms / ov["none"]["wall"]
    title = "Dashboard stream and render (`benchmarks/dashboard_bench.py`)"
    command = ["python", "benchmarks/dashboard_bench.py", *argv]
    lines = [
        header(title, command, runtime_s, machine.measure()),
        f"- Workload: {MODEL} behind a real server, kept at {RUNNING} running requests "
        "(prompt 8, 16 output tokens); no recording. Consumers are `dashboard.stream."
        "TelemetryStream`s with a `StepWindow`, in a separate process, like the live page's "
        f"(the lag consumer at the dashboard's nice {NICE}). "
        f"Lag: one consumer for {lag['seconds']:g} s, sampled every 0.25 s as now − the newest "
        "frame's `t` (when the step was produced), and that × steps/s as steps behind. "
        "Render: the consumer's last 600 real frames into a `StepWindow`, then its view "
        "through `charts.live_figures` (all panels), beside the running engine. "
        "Overhead: the loop's busy_s / steps (wall) and "
        "busy_cpu_s / steps (engine-thread CPU) in blocks of "
        f"{ov['block_s']:g} s, {ov['rounds']} rounds of one block per mode in rotated order; "
        "a consumer mode is one separate process with 3 streams of that kind. The cores are "
        "shared (other work runs at the same time)",
        "",
        "| measure | value | target | met |",
        "| --- | --- | --- | --- |",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in measure_rows(res, res["targets"])],
        "",
        "Overhead by mode, side by side in this run (CPU ms are per engine step):",
        "",
        "| consumers | mean step ms (wall) | engine-thread CPU ms | server thread CPU ms | "
        "consumer process CPU ms | ratio to none (wall; median of rounds; CPU) |",
        "| --- | --- | --- | --- | --- | --- |",
        *[
            f"| {mode} | {m['wall']:.3f} | {m['cpu']:.3f} | {m['server']:.3f} | "
            f"{m['consumer']:.3f} | {m['ratio']:.3f}; {m['pair_median']:.3f}; "
            f"{m['cpu_ratio']:.3f} |"
            for mode, m in ((k, ov[k]) for k in MODES)
        ],
        "",
        f"Reading: the A/A control's ratio ({aa['ratio']:.3f}) is how far two identical "
        "conditions drift apart on this shared machine; wall ratios inside that band are "
        f"noise. The fan-out's own cost is the server thread's CPU: {fanout_ms:.3f} ms per "
        f"step more with the dashboard's consumers than with none ({fanout_pct:.1f}% of a "
        "step, on another thread); the consumers' own CPU is in their process, which yields "
        "to the engine at the dashboard's priority.",
        "",
        "Per-block mean step ms (wall): "
        + "; ".join(
            f"{mode}: " + " / ".join(f"{b['wall']:.3f}" for b in ov["blocks"][mode])
            for mode in MODES
        )
        + ".",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure and publish; returns the lag, render and overhead runs and the targets."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--consumer"]:
        consumer(argv[1], argv[2], int(argv[3]), int(argv[4]), float(argv[5]), argv[6])
        return {}
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lag-s", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block-s", type=float, default=2.5)
    p.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.lag_s, args.repeats, args.rounds, args.block_s = 1.5, 1, 1, 0.5
    t0 = time.monotonic()
    res = run(args)
    res["targets"] = check_targets(res)
    section = render_section(res, argv, time.monotonic() - t0)
    publish(SECTION, section, results_path(args))
    return res


if __name__ == "__main__":
    main()
