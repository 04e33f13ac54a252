"""`moescope load`: an open-loop load generator for the OpenAI API.

Requests arrive as a Poisson process (exponential gaps at `--rate` per second, seeded) and
are sent whether or not earlier ones finished. Prompt and output lengths come from seeded
distributions: `fixed:N`, `uniform:LO:HI`, `lognormal:MEDIAN:SIGMA[:MAX]`. Each request
streams `/v1/completions` with `ignore_eos`, so it generates exactly its output length.
Prompts are random words of the wanted length in bytes, which is its length in tokens for
the byte tokenizer of the synthetic models (approximate for other tokenizers); or, with
`--prompts`, real text: `heldout` cuts snippets of the wanted length in the demo tokenizer's
tokens from the standard library files the demo model was not trained on, and a file gives
its prompts in order, again and again (their own lengths). A trace (JSONL: `t` offset in
seconds, `prompt_len`, `output_len`) can be saved and replayed.
"""

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from cli.args import describe, non_negative, positive
from stats import QUANTILES, summary, tpot

WORDS = (
    "expert",
    "token",
    "router",
    "batch",
    "cache",
    "step",
    "layer",
    "prefill",
    "decode",
    "block",
    "slot",
    "queue",
    "knob",
    "shard",
    "gate",
    "kernel",
)


@dataclass(frozen=True)
class Dist:
    """A seeded length distribution; every sample is at least 1."""

    kind: str
    a: float
    b: float = 0.0
    cap: float = math.inf

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.randint(int(self.a), int(self.b))
        else:
            value = min(self.cap, round(self.a * math.exp(self.b * rng.gauss(0.0, 1.0))))
        return max(1, int(value))


def parse_dist(text: str) -> Dist:
    """`fixed:64`, `uniform:16:256` or `lognormal:MEDIAN:SIGMA[:MAX]`."""
    kind, _, rest = text.partition(":")
    try:
        nums = [float(x) for x in rest.split(":")] if rest else []
    except ValueError:
        nums = []
    if kind == "fixed" and len(nums) == 1 and nums[0] >= 1:
        return Dist("fixed", nums[0])
    if kind == "uniform" and len(nums) == 2 and 1 <= nums[0] <= nums[1]:
        return Dist("uniform", nums[0], nums[1])
    if kind == "lognormal" and len(nums) in (2, 3) and nums[0] >= 1 and nums[1] >= 0:
        return Dist("lognormal", nums[0], nums[1], nums[2] if len(nums) == 3 else math.inf)
    raise ValueError(
        f"bad length distribution {text!r}: use fixed:N, uniform:LO:HI or "
        "lognormal:MEDIAN:SIGMA[:MAX] with positive numbers"
    )


@dataclass(frozen=True)
class Arrival:
    t: float
    prompt_len: int
    output_len: int


def poisson_arrivals(
    rate: float, duration: float, prompt: Dist, output: Dist, seed: int
) -> Iterator[Arrival]:
    """Arrivals in [0, duration) (duration <= 0: forever); gaps and lengths are seeded."""
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a finite number > 0, got {rate}")
    if math.isnan(duration):
        raise ValueError("duration must be a number")
    gaps, lengths = random.Random(seed), random.Random(seed + 1)
    t = 0.0
    while True:
        t += gaps.expovariate(rate)
        if 0 < duration <= t:
            return
        yield Arrival(round(t, 6), prompt.sample(lengths), output.sample(lengths))


def trace_text(arrivals: Iterable[Arrival]) -> str:
    """Arrivals as trace JSONL."""
    return "".join(json.dumps(asdict(a)) + "\n" for a in arrivals)


def load_trace(path: Path) -> list[Arrival]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            arrival = Arrival(float(rec["t"]), int(rec["prompt_len"]), int(rec["output_len"]))
            if not math.isfinite(arrival.t):
                raise ValueError(f"t is {arrival.t}")
            out.append(arrival)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: bad trace line ({exc})") from None
    return sorted(out, key=lambda a: a.t)


def make_prompt(num_tokens: int, rng: random.Random) -> str:
    """Random words, `num_tokens - 1` bytes long (the byte tokenizer adds a BOS token)."""
    size = max(1, num_tokens - 1)
    text = ""
    while len(text) < size:
        text += rng.choice(WORDS) + " "
    return text[:size]


# an arrival's prompt text, drawn with the load's seeded generator
PromptSource = Callable[[Arrival, random.Random], str]
HELD_OUT = "heldout"


def random_words(arrival: Arrival, rng: random.Random) -> str:
    return make_prompt(arrival.prompt_len, rng)


def load_prompts(path: Path) -> list[str]:
    """A file's prompts: JSONL objects with a "prompt" string when its first non-blank line
    is a JSON object, else plain text, one prompt a line; blank lines are skipped. ValueError
    naming the file and line for a bad one, OSError when it cannot be read."""
    data = path.read_bytes()
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        where = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path}:{where}: not UTF-8 text") from None
    jsonl = next((s.lstrip().startswith("{") for s in lines if s.strip()), False)
    prompts: list[str] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(line)
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: not a JSON object ({exc})") from None
        prompt = rec.get("prompt") if isinstance(rec, dict) else None
        if not (isinstance(prompt, str) and prompt):
            raise ValueError(f'{path}:{n}: no "prompt" string (JSONL, as line 1 is)')
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts in the file")
    return prompts


def file_prompts(prompts: list[str]) -> PromptSource:
    """The prompts in order, over and over (lengths are their own)."""
    turn = itertools.cycle(prompts)
    return lambda _arrival, _rng: next(turn)


def held_out_prompts() -> PromptSource:
    """Snippets of the demo model's held-out files, `prompt_len` demo tokens each."""
    from models.corpus import HeldOutSnippets  # reads the standard library: only when asked

    snippets = HeldOutSnippets()
    return lambda arrival, rng: snippets.snippet(arrival.prompt_len, rng)


def prompt_source(spec: str | None) -> PromptSource:
    """`--prompts`: None for random words, `heldout`, or a file's path."""
    if spec is None:
        return random_words
    if spec == HELD_OUT:
        return held_out_prompts()
    return file_prompts(load_prompts(Path(spec)))


@dataclass
class Result:
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0


async def send_one(
    client: httpx.AsyncClient, model: str, arrival: Arrival, prompt: str, temperature: float
) -> Result:
    """One streaming completion; TTFT and TPOT measured on the client from SSE chunk times."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": arrival.output_len,
        "temperature": temperature,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    times: list[float] = []
    usage: dict[str, int] = {}
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                detail = (await resp.aread()).decode(errors="replace")
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    detail = json.loads(detail)["error"]["message"]
                return Result(False, f"HTTP {resp.status_code}: {detail[:200]}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return Result(False, f"stream error: {chunk['error'].get('message')}")
                if chunk.get("choices"):
                    times.append(time.perf_counter())
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except (httpx.HTTPError, OSError, ValueError) as exc:
        return Result(False, f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    if not times:
        return Result(False, "no tokens received")
    return Result(
        True,
        None,
        times[0] - start,
        tpot(times),
        end - start,
        usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", len(times)),
    )


class Progress:
    """Counts for the live progress line."""

    def __init__(self) -> None:
        self.sent = self.done = self.errors = self.tokens = 0
        self.start = time.perf_counter()

    def line(self) -> str:
        el = time.perf_counter() - self.start
        return (
            f"{el:7.1f}s  sent {self.sent}  done {self.done}  in flight "
            f"{self.sent - self.done}  errors {self.errors}  "
            f"{self.tokens / el if el else 0.0:.1f} tok/s"
        )


async def _progress_task(progress: Progress, stream: Any) -> None:
    tty = stream.isatty()
    while True:
        await asyncio.sleep(0.5 if tty else 5.0)
        print(
            ("\r" if tty else "") + progress.line(),
            end="" if tty else "\n",
            file=stream,
            flush=True,
        )


async def run_load(
    url: str,
    arrivals: Iterable[Arrival],
    *,
    model: str | None = None,
    api_key: str | None = None,
    seed: int = 0,
    temperature: float = 0.0,
    timeout_s: float = 600.0,
    progress_stream: Any = None,
    prompts: PromptSource = random_words,
) -> dict[str, Any]:
    """Send every arrival at its offset (open loop) with a prompt from `prompts`, wait for
    all, and summarize.

    Cancelled (Ctrl-C), it stops sending, drops what is in flight and summarizes the rest.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"),
        headers=headers,
        limits=limits,
        timeout=httpx.Timeout(timeout_s, connect=10.0),
    ) as client:
        if model is None:
            resp = await client.get("/v1/models")
            resp.raise_for_status()
            model = resp.json()["data"][0]["id"]
        progress = Progress()
        ticker = (
            asyncio.create_task(_progress_task(progress, progress_stream))
            if progress_stream is not None
            else None
        )
        results: list[Result] = []

        async def run(arrival: Arrival, prompt: str) -> None:
            res = await send_one(client, model, arrival, prompt, temperature)
            results.append(res)
            progress.done += 1
            progress.errors += not res.ok
            progress.tokens += res.output_tokens

        rng = random.Random(seed + 2)
        tasks = []
        start = time.perf_counter()
        try:
            for arrival in arrivals:
                # sleep(0) still yields, so a burst cannot starve the loop (or Ctrl-C)
                await asyncio.sleep(max(0.0, start + arrival.t - time.perf_counter()))
                tasks.append(asyncio.create_task(run(arrival, prompts(arrival, rng))))
                progress.sent += 1
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            pass
        finally:
            for task in tasks:
                task.cancel()
            if ticker is not None:
                ticker.cancel()
                print("\r" + progress.line(), file=progress_stream, flush=True)
        return summarize(results, time.perf_counter() - start, model, progress.sent)


def summarize(
    results: list[Result], wall_s: float, model: str, sent: int | None = None
) -> dict[str, Any]:
    """Counts, throughput and latency summaries (`stats.summary`, in ms); requests cut off in
    flight are `cancelled`."""
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "?"] = errors.get(r.error or "?", 0) + 1
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    return {
        "model": model,
        "requests": len(results),
        "cancelled": max(0, (sent or 0) - len(results)),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_messages": errors,
        "duration_s": round(wall_s, 3),
        "request_throughput": round(len(ok) / wall_s, 3) if wall_s else 0.0,
        "output_throughput": round(out_tokens / wall_s, 2) if wall_s else 0.0,
        "total_token_throughput": round((in_tokens + out_tokens) / wall_s, 2) if wall_s else 0.0,
        "prompt_tokens": in_tokens,
        "output_tokens": out_tokens,
        "ttft_ms": summary_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": summary_ms([r.tpot_s for r in ok if r.tpot_s is not None]),
        "e2e_ms": summary_ms([r.e2e_s for r in ok if r.e2e_s is not None]),
    }


def summary_ms(seconds: list[float]) -> dict[str, float | None]:
    """`stats.summary` of latencies in seconds, in milliseconds to the microsecond."""
    s = summary(x * 1000 for x in seconds)
    return {k: v if k == "count" or v is None else round(v, 3) for k, v in s.items()}


def percentiles_text(s: dict[str, float | None], digits: int) -> str:
    """`p50 1.0  p90 2.0  p99 3.0` of a summary (`-` where there is none)."""
    return "  ".join(
        f"p{q} " + ("-" if s[f"p{q}"] is None else f"{s[f'p{q}']:.{digits}f}") for q in QUANTILES
    )


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"model            {s['model']}",
        f"requests         {s['requests'] + s['cancelled']} sent, {s['ok']} ok, "
        f"{s['errors']} errors, {s['cancelled']} cancelled in flight",
        f"duration         {s['duration_s']:.1f} s",
        f"throughput       {s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} "
        f"output tok/s ({s['total_token_throughput']:.1f} total tok/s)",
        f"TTFT ms          {percentiles_text(s['ttft_ms'], 1)}",
        f"TPOT ms          {percentiles_text(s['tpot_ms'], 1)}",
        f"E2E ms           {percentiles_text(s['e2e_ms'], 1)}",
    ]
    lines += [f"error            {msg} (x{n})" for msg, n in s["error_messages"].items()]
    return "\n".join(lines)


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--api-key", default=None, help="Bearer key (or MOESCOPE_API_KEY)")
    p.add_argument("--model", default=None, help="model name (default: the server's first)")
    p.add_argument("--rate", type=positive, default=2.0, help="mean arrivals per second")
    p.add_argument(
        "--duration",
        type=non_negative,
        default=30.0,
        help="seconds of arrivals; 0 = until interrupted",
    )
    p.add_argument("--prompt-len", type=parse_dist, default=parse_dist("uniform:16:256"))
    p.add_argument("--output-len", type=parse_dist, default=parse_dist("uniform:16:128"))
    p.add_argument(
        "--prompts",
        default=None,
        metavar="SOURCE",
        help=f"real prompts: {HELD_OUT!r} (snippets of the demo model's held-out standard "
        'library files, --prompt-len demo tokens each) or a file (JSONL with a "prompt" '
        "field, or text, one prompt a line; in order, repeated); default: random words",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--timeout", type=positive, default=600.0, help="per-request timeout (s)")
    p.add_argument("--save-trace", type=Path, default=None, help="write the arrivals as JSONL")
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="replay arrivals from JSONL (ignores rate, duration and lengths)",
    )
    p.add_argument("--summary-json", type=Path, default=None, help="also write the summary")
    p.add_argument("--no-progress", action="store_true")


def _arrivals(args: argparse.Namespace) -> Iterable[Arrival]:
    """The trace's arrivals, or Poisson ones; saved first with `--save-trace`."""
    if args.trace is not None:
        try:
            arrivals: Iterable[Arrival] = load_trace(args.trace)
        except OSError as exc:
            raise SystemExit(f"moescope load: cannot read {args.trace}: {describe(exc)}") from None
        except ValueError as exc:
            raise SystemExit(f"moescope load: {exc}") from None
    else:
        arrivals = poisson_arrivals(
            args.rate, args.duration, args.prompt_len, args.output_len, args.seed
        )
    if args.save_trace is not None:
        if args.trace is None and args.duration <= 0:
            raise SystemExit("moescope load: --save-trace needs a finite --duration")
        arrivals = list(arrivals)
        _write(args.save_trace, trace_text(arrivals))
    return arrivals


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise SystemExit(f"moescope load: cannot write {path}: {describe(exc)}") from None


def main_load(args: argparse.Namespace) -> int:
    arrivals = _arrivals(args)
    try:
        prompts = prompt_source(args.prompts)
    except OSError as exc:
        raise SystemExit(f"moescope load: cannot read {args.prompts}: {describe(exc)}") from None
    except ValueError as exc:
        raise SystemExit(f"moescope load: --prompts: {exc}") from None
    api_key = args.api_key or os.environ.get("MOESCOPE_API_KEY")
    try:
        result = asyncio.run(
            run_load(
                args.url,
                arrivals,
                model=args.model,
                api_key=api_key,
                seed=args.seed,
                temperature=args.temperature,
                timeout_s=args.timeout,
                progress_stream=None if args.no_progress else sys.stderr,
                prompts=prompts,
            )
        )
    except httpx.HTTPError as exc:
        print(f"moescope load: cannot reach {args.url}: {describe(exc)}", file=sys.stderr)
        return 2
    print(format_summary(result))
    if args.summary_json is not None:
        _write(args.summary_json, json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] or not result["requests"] else 1
