"""Soak: the server's memory over minutes of streaming load and knob changes.

`moescope serve` (synthetic:tiny, 512 KV blocks, 1 thread, recording to SQLite) under
`moescope load` (Poisson arrivals, streaming) while this process, side by side:
- changes max_num_seqs (8 / 16 / 32 / 64) every `--change-s` (each one predicted by the
  scorecard's twin and observed after the what-if horizon);
- opens a streaming completion every second and hangs up after its first chunk;
- sends a bad request every two seconds (each must be a 4xx);
- connects a telemetry websocket every five seconds and leaves after a few records.
Every `--sample-s` it samples the RSS of the server and of its child processes (the
analysis process). The reading is the growth after the warm-up (`--warmup-s`): the
windows fill while the first minutes run, and nothing may grow after them.
Writes its section of benchmarks/RESULTS.md.

    python -m benchmarks.control.soak            # --quick for a one-minute smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from websockets.asyncio.client import connect

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.harness.server_process import healthy
from benchmarks.harness.targets import Target
from cli.demo import CLI
from engine.ep.ranks import free_port

SECTION = "soak"
TARGETS = {"growth": Target("RSS growth after the warm-up, MB", 20.0, higher_is_better=False)}
MODEL = "synthetic:tiny"
KNOB_VALUES = (8, 16, 32, 64)
BAD_BODIES = (
    {"model": MODEL, "prompt": "x", "max_tokens": -1},
    {"model": MODEL, "prompt": "x", "temperature": "hot"},
    {"model": MODEL},
)
MB = 1 << 20


@dataclass
class Counts:
    """What the side traffic saw; every answer must be what it should."""

    changes: int = 0
    hangups: int = 0
    bad_inputs: int = 0
    websockets: int = 0
    wrong: list[str] = field(default_factory=list)  # answers that should not have come


@dataclass(frozen=True)
class Sample:
    t: float
    changes: int
    server_mb: float
    children_mb: float

    @property
    def total_mb(self) -> float:
        return self.server_mb + self.children_mb


def rss(proc: psutil.Process) -> tuple[float, float]:
    """The RSS of `proc` and of all its descendants, MB."""
    children = 0
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            children += child.memory_info().rss
    return proc.memory_info().rss / MB, children / MB


async def every(period_s: float, until: float, action: Any) -> None:
    """`await action(i)` every `period_s` until the clock reaches `until`."""
    for i in itertools.count():
        if time.monotonic() >= until:
            return
        started = time.monotonic()
        await action(i)
        await asyncio.sleep(max(0.0, period_s - (time.monotonic() - started)))


async def side_traffic(url: str, until: float, change_s: float, counts: Counts) -> None:
    """Knob changes, hang-ups, bad inputs and websocket clients, side by side until `until`."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def change(i: int) -> None:
            value = KNOB_VALUES[i % len(KNOB_VALUES)]
            resp = await client.patch("/api/knobs", json={"max_num_seqs": value})
            counts.changes += 1
            if resp.status_code != 200:
                counts.wrong.append(f"PATCH /api/knobs: {resp.status_code}")

        async def hang_up(i: int) -> None:
            body = {"model": MODEL, "prompt": f"hang up {i}", "max_tokens": 64, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    counts.wrong.append(f"hang-up {i}: {resp.status_code}")
                async for _ in resp.aiter_lines():
                    break  # the first chunk, then the client is gone
            counts.hangups += 1

        async def bad_input(i: int) -> None:
            resp = await client.post("/v1/completions", json=BAD_BODIES[i % len(BAD_BODIES)])
            counts.bad_inputs += 1
            if not 400 <= resp.status_code < 500:
                counts.wrong.append(f"bad input {i}: {resp.status_code}")

        async def websocket(i: int) -> None:
            ws_url = url.replace("http://", "ws://") + "/ws/telemetry"
            async with connect(ws_url, max_size=None) as ws:
                for _ in range(3):
                    json.loads(await asyncio.wait_for(ws.recv(), 30))
            counts.websockets += 1

        await asyncio.gather(
            every(change_s, until, change),
            every(1.0, until, hang_up),
            every(2.0, until, bad_input),
            every(5.0, until, websocket),
        )


async def sample_memory(
    proc: psutil.Process, until: float, period_s: float, counts: Counts
) -> list[Sample]:
    samples: list[Sample] = []
    start = time.monotonic()

    async def take(_: int) -> None:
        server, children = rss(proc)
        samples.append(Sample(time.monotonic() - start, counts.changes, server, children))
        s = samples[-1]
        print(
            f"{s.t:6.0f} s  changes {s.changes:5d}  server {s.server_mb:7.1f} MB  "
            f"children {s.children_mb:7.1f} MB",
            file=sys.stderr,
            flush=True,
        )

    await every(period_s, until + 0.5 * period_s, take)
    return samples


def growth(samples: list[Sample], warmup_s: float) -> float:
    """Total RSS at the end less at the first sample after the warm-up, MB."""
    after = [s for s in samples if s.t >= warmup_s]
    return after[-1].total_mb - after[0].total_mb if len(after) > 1 else float("nan")


def run(args: argparse.Namespace, db: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [
        *(*CLI, "serve", "--model", MODEL, "--port", str(port), "--kv-blocks", "512"),
        *("--threads", "1", "--db", f"sqlite:///{db}", "--log-level", "warning"),
    ]
    server = subprocess.Popen(serve, stdout=subprocess.DEVNULL)
    with healthy(server, url, "/api/status", 180, lambda: "see the server's stderr above"):
        load = subprocess.Popen(
            [
                *(*CLI, "load", "--url", url, "--rate", str(args.rate)),
                *("--prompt-len", "uniform:8:64", "--output-len", "uniform:8:64"),
                *("--duration", str(args.duration_s + 5)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        counts = Counts()
        until = time.monotonic() + args.duration_s

        async def both() -> list[Sample]:
            samples, _ = await asyncio.gather(
                sample_memory(psutil.Process(server.pid), until, args.sample_s, counts),
                side_traffic(url, until, args.change_s, counts),
            )
            return samples

        try:
            samples = asyncio.run(both())
        finally:
            load.terminate()
            load.wait(30)
        status = _idle_status(url)
    return {"samples": samples, "counts": counts, "status": status}


def _idle_status(url: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """/api/status once no request runs or waits (the load has stopped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status: dict[str, Any] = httpx.get(url + "/api/status", timeout=30).json()
        queue = status["queue"]
        busy = queue["running"] or queue["waiting"] or queue["swapped"]
        if not busy or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def render(
    args: argparse.Namespace, argv: list[str], out: dict[str, Any], runtime_s: float
) -> tuple[str, float]:
    samples: list[Sample] = out["samples"]
    counts: Counts = out["counts"]
    status = out["status"]
    grown = growth(samples, args.warmup_s)
    minutes = (samples[-1].t - args.warmup_s) / 60 if samples else 0.0
    lines = [
        header(
            "Server memory under a soak",
            ["python", "-m", __spec__.name, *argv],
            runtime_s,
            machine.measure(),
        ),
        f"- Commit: {machine.engine_revision()}",
        f"- Load: `moescope load --rate {args.rate}` streaming, uniform 8-64 prompt and output "
        f"tokens; a knob change every {args.change_s} s, a hang-up every 1 s, a bad input every "
        "2 s, a telemetry websocket every 5 s",
        "",
        "| t (s) | knob changes | server MB | children MB | total MB |",
        "| --- | --- | --- | --- | --- |",
    ]
    step = max(1, len(samples) // 20)
    for s in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
        lines.append(
            f"| {s.t:.0f} | {s.changes} | {s.server_mb:.1f} | {s.children_mb:.1f} | "
            f"{s.total_mb:.1f} |"
        )
    kv_used = status["kv"]["used"] if "kv" in status else "?"
    lines += [
        "",
        f"- Side traffic: {counts.changes} knob changes, {counts.hangups} hang-ups, "
        f"{counts.bad_inputs} bad inputs, {counts.websockets} websocket clients; "
        f"{len(counts.wrong)} wrong answers {counts.wrong[:5]}",
        f"- Idle after the load: KV blocks in use {kv_used}; bounded structures "
        + ", ".join(f"{k} {v['size']}/{v['limit']}" for k, v in status.get("sizes", {}).items()),
        "",
        TARGETS["growth"].line(grown, f"{grown:+.1f} MB over the last {minutes:.1f} min"),
    ]
    return "\n".join(lines), grown


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--warmup-s", type=float, default=120.0, help="growth is read after this")
    p.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period")
    p.add_argument("--change-s", type=float, default=0.5, help="knob change period")
    p.add_argument("--rate", type=float, default=20.0, help="load arrivals per second")
    p.add_argument("--quick", action="store_true", help="one minute, 20 s warm-up")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.duration_s, args.warmup_s, args.sample_s = 60.0, 20.0, 5.0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = run(args, Path(tmp) / "soak.db")
    section, grown = render(args, argv, out, time.perf_counter() - started)
    publish(SECTION, section, results_path(args))
    return {**out, "growth_mb": grown}


if __name__ == "__main__":
    main()
