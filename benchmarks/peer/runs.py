"""One timed run of the peer workload against one server, and what it takes: llama-server
and `moescope serve` started in fresh subprocesses once the machine is quiet, the async client
that drives both alike, the offline arm (`offline.py`, in a fresh process), the seeded
checkpoint and the contexts the runs share. `llamacpp.py` and `serve_overhead.py` run these;
`report.py` describes them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil

from benchmarks.harness.server_process import healthy
from benchmarks.peer import build as peer_build
from benchmarks.speed.offline_runners import (
    FINE_SHAPE,
    SERVE_SHAPE,
    Shape,
    Workload,
    build_checkpoint,
    quiet_transformers,
)
from engine.ep.ranks import free_port

REPO = Path(__file__).resolve().parents[2]
SHAPES = {"serve": SERVE_SHAPE, "fine": FINE_SHAPE}  # --shape: issue 17's, fine-grained experts
PROMPT_RANGE, OUTPUT_RANGE = (16, 512), (8, 245)
DTYPES = {"f32": "float32", "bf16": "bfloat16"}
SERVED_NAME = "peer"
RUN_LIMIT_S = 900  # a run this long means the machine is swamped: stop rather than wait
# Before each run, wait (at most QUIET_WAIT_S, or --quiet-wait) until other processes use less
# than QUIET_CORES: llama.cpp's spinning thread barriers slow down many times over on
# oversubscribed cores.
QUIET_CORES, QUIET_WAIT_S = 0.2, 600


def add_quiet_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=QUIET_WAIT_S,
        metavar="S",
        help="longest wait for other processes to quiet down before each run (0: none; "
        "lower it where other work keeps the cores busy)",
    )


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that makes a subprocess import the project from `tree` (another
    checkout, say a git worktree of an older commit) rather than the installed one."""
    return {**os.environ, "PYTHONPATH": str(tree)}


def progress(message: str) -> None:
    print(f"[peer] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- servers


@dataclass(frozen=True)
class LlamaSetting:
    """The llama-server knobs the sweep moves (`-np`, `-t`/`-tb`, `-ub`, `-fa`)."""

    parallel: int
    threads: int = 2
    ubatch: int = 512
    flash: str = "off"

    def __str__(self) -> str:
        return f"-np {self.parallel} -t {self.threads} -ub {self.ubatch} -fa {self.flash}"

    def args(self, slot_ctx: int, kv: str) -> list[str]:
        # -c is shared among the slots: each gets slot_ctx, room for the longest request
        return [
            *("-np", str(self.parallel), "-c", str(self.parallel * slot_ctx)),
            *("-t", str(self.threads), "-tb", str(self.threads)),
            *("-ub", str(self.ubatch), "-b", str(max(2048, self.ubatch)), "-fa", self.flash),
            *("-ctk", kv, "-ctv", kv, "--cache-ram", "0"),
        ]


@dataclass
class Server:
    """A server subprocess, its URL and which engine it is (`llama.cpp`, `moescope`)."""

    engine: str
    proc: subprocess.Popen[bytes]
    url: str

    def cpu_s(self) -> float:
        """The process's CPU seconds so far (user + system, children included)."""
        return _process_cpu(psutil.Process(self.proc.pid))


def _process_cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def busy_cpu() -> float:
    """CPU seconds the whole machine has spent running anything (steal and guest time, the
    latter already inside user, left out)."""
    t = psutil.cpu_times()
    return t.user + t.system + sum(getattr(t, f, 0.0) for f in ("nice", "irq", "softirq"))


def wait_quiet(limit_s: float = QUIET_WAIT_S, window_s: float = 2.0) -> float:
    """Wait until the machine's busy CPU over `window_s` falls below QUIET_CORES (this process
    is idle meanwhile) or `limit_s` passes; returns the seconds waited."""
    started = time.monotonic()
    while True:
        busy0 = busy_cpu()
        time.sleep(window_s)
        cores = (busy_cpu() - busy0) / window_s
        waited = time.monotonic() - started
        if cores < QUIET_CORES or waited > limit_s:
            if waited > 1.5 * window_s:
                progress(f"waited {waited:.0f} s for other processes to quiet down")
            return waited
        if waited < window_s * 1.5:
            progress(f"other processes use {cores:.1f} cores; waiting for them to quiet down")


@contextlib.contextmanager
def serving(
    engine: str, cmd: list[str], health: str, log: Path, quiet_s: float, tree: Path = REPO
) -> Iterator[Server]:
    """`cmd` (which takes the port from `{port}`) started in `tree`, once the machine is quiet
    (`wait_quiet`, at most `quiet_s`; 0: no wait), healthy, and stopped after."""
    if quiet_s > 0:
        wait_quiet(quiet_s)
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        argv = [c.replace("{port}", str(port)) for c in cmd]
        env = tree_env(tree)
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tree, env=env)
    server = Server(engine, proc, f"http://127.0.0.1:{port}")
    with healthy(proc, server.url, health, 180, lambda: f"{engine}: see {log}"):
        yield server


def llama(
    bins: Path, gguf: Path, setting: LlamaSetting, slot_ctx: int, kv: str, quiet_s: float
) -> contextlib.AbstractContextManager[Server]:
    cmd = [str(bins / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", "{port}"]
    cmd += setting.args(slot_ctx, kv)
    log = peer_build.CACHE / "logs" / "llama-server.log"
    return serving("llama.cpp", cmd, "/health", log, quiet_s)


def moescope_args(dtype: str, kv_blocks: int, threads: int) -> list[str]:
    """`moescope serve`'s flags in this benchmark (after --model and --port)."""
    return [
        *("--threads", str(threads), "--dtype", dtype, "--max-num-seqs", "128"),
        *("--kv-blocks", str(kv_blocks), "--served-model-name", SERVED_NAME),
        *("--no-record", "--no-metrics"),
    ]


def moescope(
    model: Path, args: list[str], quiet_s: float, tree: Path = REPO
) -> contextlib.AbstractContextManager[Server]:
    """`moescope serve` of the project in `tree` (this checkout by default)."""
    cmd = [sys.executable, "-m", "cli.main", "serve", "--model", str(model.resolve())]
    cmd += ["--port", "{port}"]
    log = peer_build.CACHE / "logs" / "moescope-serve.log"
    return serving("moescope", cmd + args, "/api/status", log, quiet_s, tree)


# ---------------------------------------------------------------- the client


def request_body(engine: str, prompt: list[int], n: int, tokens: bool = False) -> tuple[str, dict]:
    """The path and body of one greedy, EOS-ignoring completion of `n` tokens."""
    if engine == "llama.cpp":
        body = {"prompt": prompt, "n_predict": n, "ignore_eos": True, "temperature": 0.0}
        return "/completion", {**body, "cache_prompt": False, "return_tokens": tokens}
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": n, "ignore_eos": True}
    return "/v1/completions", {**body, "temperature": 0.0}


def _count(engine: str, reply: dict[str, Any]) -> int:
    if engine == "llama.cpp":
        return reply["tokens_predicted"]
    return reply["usage"]["completion_tokens"]


async def _send(session: aiohttp.ClientSession, server: Server, prompt: list[int], n: int) -> int:
    path, body = request_body(server.engine, prompt, n)
    async with session.post(server.url + path, json=body) as reply:
        reply.raise_for_status()
        return _count(server.engine, await reply.json())


async def _send_all(server: Server, wl: Workload) -> tuple[float, list[int]]:
    """Every request at once; the wall seconds from the first send to the last reply.

    aiohttp, not httpx: httpx's pool rescans every connection for every queued request, and
    with 128 requests at once that cost this client 0.45 CPU s a run (0.07 with aiohttp), on
    the two cores the server under test runs on."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        pairs = zip(wl.prompts, wl.max_tokens, strict=True)
        counts = await asyncio.gather(*(_send(session, server, p, n) for p, n in pairs))
        return time.perf_counter() - start, list(counts)


@dataclass
class Run:
    """One timed run of the workload against one server."""

    engine: str
    setting: str
    wall_s: float
    tokens: int
    cpu_s: float
    others_cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s


def timed_run(server: Server, wl: Workload, setting: str) -> Run:
    """The workload once (after a warm-up of two short requests), its counts checked; with
    the server's CPU time, this client's (`extra["client_cpu_s"]`) and that of every other
    process (the machine is shared: what others ran meanwhile)."""
    asyncio.run(_send_all(server, Workload([[1 + i for i in range(24)]] * 2, [8, 8])))
    me = psutil.Process()
    loop0 = _engine_loop(server)
    cpu0, busy0, mine0 = server.cpu_s(), busy_cpu(), _process_cpu(me)
    wall, counts = asyncio.run(asyncio.wait_for(_send_all(server, wl), RUN_LIMIT_S))
    cpu, client_cpu = server.cpu_s() - cpu0, _process_cpu(me) - mine0
    others = busy_cpu() - busy0 - cpu - client_cpu
    wrong = [i for i, (c, n) in enumerate(zip(counts, wl.max_tokens, strict=True)) if c != n]
    if wrong:
        raise RuntimeError(f"{server.engine}: {len(wrong)} requests with a wrong token count")
    run = Run(server.engine, setting, wall, sum(counts), cpu, max(others, 0.0))
    run.extra["client_cpu_s"] = client_cpu
    if loop0:
        loop1 = _engine_loop(server)
        run.extra.update({k: loop1[k] - loop0[k] for k in ("steps", "busy_s", "busy_cpu_s")})
    return run


def _engine_loop(server: Server) -> dict[str, Any]:
    """moescope's engine-loop counters (steps, time in steps); nothing for llama.cpp."""
    if server.engine != "moescope":
        return {}
    return httpx.get(server.url + "/api/status", timeout=10).json()["loop"]


# ---------------------------------------------------------------- contexts and runs


@dataclass
class OursContext:
    """What moescope's runs need: the checkpoint (of `shape`), its KV blocks, the threads,
    the workload's size and seed, the longest wait for quiet before each run and the
    checkout whose engine runs."""

    shape: Shape
    model: Path
    kv_blocks: int
    threads: int
    requests: int
    seed: int
    quiet_s: float = QUIET_WAIT_S  # 0: start each run at once
    tree: Path = REPO


@dataclass(kw_only=True)
class Context(OursContext):
    """What every run needs: moescope's, and llama.cpp's source and binaries, the GGUFs and
    each slot's context."""

    source: peer_build.Source
    bins: Path
    gguf: dict[str, Path]
    slot_ctx: int


def cached_checkpoint(shape: Shape, seed: int) -> Path:
    """The benchmark's seeded checkpoint of `shape` under the peer cache, built if missing."""
    model = peer_build.CACHE / "models" / checkpoint_name(shape, seed)
    if not (model / "config.json").exists():
        progress(f"building checkpoint at {model}")
        with quiet_transformers():
            build_checkpoint(model, shape, seed)
    return model


def checkpoint_name(shape: Shape, seed: int) -> str:
    experts = (
        f"-e{shape.experts}k{shape.top_k}i{shape.intermediate}" if shape != SERVE_SHAPE else ""
    )
    return f"mixtral-v{shape.vocab}-h{shape.hidden}{experts}-seed{seed}"


def llama_run(ctx: Context, precision: str, setting: LlamaSetting, wl: Workload) -> Run:
    gguf = ctx.gguf[precision]
    with llama(ctx.bins, gguf, setting, ctx.slot_ctx, precision, ctx.quiet_s) as server:
        return timed_run(server, wl, str(setting))


def moescope_run(
    ctx: OursContext, precision: str, wl: Workload, extra: tuple[str, ...] = ()
) -> Run:
    """The workload against `moescope serve` (with `extra` flags) of `ctx.tree`."""
    args = [*moescope_args(DTYPES[precision], ctx.kv_blocks, ctx.threads), *extra]
    with moescope(ctx.model, args, ctx.quiet_s, ctx.tree) as server:
        return timed_run(server, wl, " ".join(args))


def offline_run(ctx: OursContext, precision: str, via: str = "steps", overlap: bool = False) -> Run:
    """The workload through the engine `moescope serve` runs, with its flags, in process
    (`offline.py` of `ctx.tree`, a fresh process like each server's), stepped on the main
    thread or, `via="loop"`, by an engine loop on its own thread."""
    if ctx.quiet_s > 0:
        wait_quiet(ctx.quiet_s)
    cmd = [sys.executable, "-m", "benchmarks.peer.offline", str(ctx.model.resolve())]
    cmd += [*("--dtype", DTYPES[precision], "--threads", str(ctx.threads))]
    cmd += [*("--kv-blocks", str(ctx.kv_blocks), "--requests", str(ctx.requests))]
    cmd += ["--seed", str(ctx.seed), "--via", via, *(["--overlap"] if overlap else [])]
    env = tree_env(ctx.tree)
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ctx.tree, env=env)
    out = json.loads(done.stdout)
    run = Run(
        "moescope offline",
        "LLMEngine" if via == "steps" else "EngineLoop",
        out["wall_s"],
        out["tokens"],
        out["cpu_s"],
        out["others_cpu_s"],
    )
    run.extra.update(steps=out["steps"], busy_s=out["busy_s"])
    return run


def kv_blocks(wl: Workload) -> int:
    """KV blocks of 16 that hold every request of `wl` at once, and some to spare."""
    return wl.blocks(16) + 128
