"""The what-if twin's accuracy: its predictions against real reruns, and the reruns' own noise.

What it measures. Three sessions are recorded on a real server, with load below, near and
above the engine's capacity. For each, the twin (`tuning.twin.whatif.twin_from_recording` on the
recorded session, then `Twin.run`) predicts the session's request trace under the defaults
and six other knob settings: slots, token budget, chunk size, policy, KV capacity and
expert capacity factor. Then each setting is rerun for real on the same server (PATCH
/api/knobs, then POST /api/sessions/{id}/rerun) `--reruns` times, in rounds that start at
a different setting so that drift falls evenly on all of them. The median of a setting's
reruns is its measured value, and their range (max - min) is its noise floor. Both sides
are computed with `tuning.twin.outcome`; the measured side comes from each rerun's recorded steps
and requests. Also measured: the time of each simulation against each rerun's wall time,
the cost model's fit error (MAPE) per session. The judged twin is fitted on one extra rerun
of each session under its own knobs (reruns are what it is judged against; the recording
itself ran over HTTP in another regime); the twin of the recording is judged too, as a
diagnostic.

- Server: `moescope serve` on `synthetic:small` (1 torch thread) in a subprocess, recording
  into a temporary SQLite database. A fresh server runs each session, because each
  server's run is one recorded session.
- Capacity: measured first on a throwaway server. A burst of `--burst` requests of the mix
  is sent at once (more than the slots), and the tokens decoded while requests wait are
  converted to requests per second.
- Sessions: `cli/loadgen.py` sends Poisson arrivals, each streaming `/v1/completions`, at
  `load` x capacity (0.5, 0.8, 1.4) for `--duration` s. A `--long-share` of the prompts are
  1-2k tokens long. The `near` session adds a phase at 3x the rate; under the `above`
  one a queue builds.
- Targets (TARGETS), for throughput, TTFT p50/p90, TPOT p50/p90, peak KV blocks and
  preemptions:
  - each prediction within max(rerun spread, 15% of the median);
  - within 25% where a setting moves a metric 2x or more from the defaults' measured value;
  - expert drop rate within 1 percentage point;
  - >= 90% of the setting pairs whose reruns do not overlap ordered as the reruns order them;
  - a simulation >= 100x faster than a rerun.

Writes a section of benchmarks/RESULTS.md, and `main` returns its data.

Run: `python -m benchmarks.control.twin` for the full run. On 2 cores it takes about 20-25 min,
mostly the 3 sessions x 7 settings x 3 reruns of 15-30 s each; the log prints the time the
twin expects each round of reruns to take. `--sessions near` runs fewer sessions and
`--duration` sets shorter ones. `python -m benchmarks.control.twin --quick` is a smoke run of about
20 s: synthetic:tiny, one 3 s session, the defaults and one other setting, one rerun each.
It writes nothing unless `--results` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.harness.targets import Target
from benchmarks.speed.serving import server
from cli.loadgen import Arrival, parse_dist, poisson_arrivals, run_load
from stats import percentile
from storage import Store
from storage import queries as q
from tuning.twin.outcome import outcome, step_totals
from tuning.twin.whatif import Twin, sim_outcome, twin_from_recording

SECTION = "twin"
METRICS = (
    "throughput_tok_s",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "tpot_p50_ms",
    "tpot_p90_ms",
    "peak_kv_blocks",
    "preemptions",
)
NOISE_SHARE = 0.15  # a prediction may be off by this share of the median (or the spread)
MOVE = 2.0  # a setting that moves a metric by this factor from the defaults' ...
MOVED_SHARE = 0.25  # ... must be predicted within this share of the median
DROP_PP = 1.0  # expert drop rate: percentage points
TARGETS = {
    "noise": Target("predictions within max(rerun spread, 15% of the median), share", 1.0),
    "moved": Target(
        "predictions within 25% where a setting moves the metric 2x or more from the "
        "defaults, share",
        1.0,
    ),
    "drop": Target("largest expert drop rate error, percentage points", DROP_PP, False),
    "ranking": Target("setting pairs ordered as their (non-overlapping) reruns, share", 0.9),
    "speed": Target("smallest ratio of rerun wall time to simulation time", 100.0),
}
BURST_AT, BURST_SHARE = 0.4, 1 / 6  # the burst phase: from 40% of the duration, 1/6 of it
STATUS_POLL_S = 0.25
STEP_LIMIT = 1_000_000  # steps read back from a session (all of them)
MIN_WINDOW = 10  # saturated steps that measure the capacity
QUICK_SETTINGS = 2  # --quick: the defaults and the first other setting


@dataclass(frozen=True)
class Load:
    """One recorded session: arrivals at `load` x capacity, with a 3x burst phase or not."""

    name: str
    load: float
    burst: bool


LOADS = (Load("below", 0.5, False), Load("near", 0.8, True), Load("above", 1.4, False))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic:small")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals a session")
    p.add_argument("--prompt-len", default="uniform:16:256")
    p.add_argument("--long-prompt-len", default="uniform:1024:1800")
    p.add_argument("--long-share", type=float, default=0.1, help="share of long prompts")
    p.add_argument("--output-len", default="uniform:16:96")
    p.add_argument("--reruns", type=int, default=3, help="real reruns of each setting")
    p.add_argument("--capacity", type=float, default=None, help="req/s (default: measured)")
    p.add_argument("--burst", type=int, default=96, help="requests of the capacity burst")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    p.add_argument(
        "--sessions", default=",".join(load.name for load in LOADS), help="which, comma-separated"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="synthetic:tiny, one short session")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.duration, args.reruns, args.capacity = "synthetic:tiny", 3.0, 1, 20.0
        args.prompt_len, args.long_prompt_len = "uniform:8:64", "uniform:256:512"
        args.output_len, args.sessions = "uniform:4:32", "near"
    return args


def mixed_arrivals(
    rate: float, duration: float, burst: bool, args: argparse.Namespace, seed: int
) -> list[Arrival]:
    """Poisson arrivals at `rate` for `duration` s, a `--long-share` of them with long prompts,
    plus (with `burst`) arrivals at twice the rate again during the burst phase."""
    prompt, long, output = (
        parse_dist(x) for x in (args.prompt_len, args.long_prompt_len, args.output_len)
    )
    streams = [
        list(poisson_arrivals(rate * (1 - args.long_share), duration, prompt, output, seed)),
        list(poisson_arrivals(rate * args.long_share, duration, long, output, seed + 1)),
    ]
    if burst:
        start = BURST_AT * duration
        extra = poisson_arrivals(2 * rate, BURST_SHARE * duration, prompt, output, seed + 2)
        streams.append([Arrival(start + a.t, a.prompt_len, a.output_len) for a in extra])
    return sorted(itertools.chain(*streams), key=lambda a: a.t)


@dataclass
class Served:
    """A running server, a client for it, and how many requests it has ended (to know when
    its recorder has written them all)."""

    url: str
    client: httpx.Client
    requests: int = 0

    def status(self) -> dict[str, Any]:
        resp = self.client.get("/api/status")
        resp.raise_for_status()
        return resp.json()


@contextlib.contextmanager
def served(args: argparse.Namespace, db: str | None) -> Iterator[Served]:
    """A fresh `moescope serve` recording into `db` (None: not recording)."""
    with (
        server(args.model, args.threads, False, [], db) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        yield Served(url, client)


def wait_until(s: Served, done: Any, what: str, timeout_s: float = 1800.0) -> dict[str, Any]:
    """Poll /api/status until `done(status)`; the last status."""
    deadline = time.monotonic() + timeout_s
    while not done(status := s.status()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(STATUS_POLL_S)
    return status


def settle(s: Served) -> None:
    """Wait until the engine is idle and the recorder has written every step and request;
    refuse a run whose recorder dropped any (its metrics would be wrong)."""

    def written(st: dict[str, Any]) -> bool:
        rec = st["recorder"]
        return (
            not any(st["queue"].values())
            and rec["pending_steps"] == 0
            and rec["written_steps"] + rec["dropped_steps"] >= st["loop"]["steps"]
            and rec["written_requests"] + rec["dropped_requests"] >= s.requests
        )

    rec = wait_until(s, written, "the recorder")["recorder"]
    if rec["dropped_steps"] or rec["dropped_requests"]:
        raise RuntimeError(f"the recorder dropped records: {rec}")


def measure_capacity(args: argparse.Namespace, store: Store, db: str) -> float:
    """Requests per second the defaults serve when saturated: a burst of `--burst` requests of
    the mix at once (more than the slots) on a throwaway server; the tokens decoded from the
    first request's end to the last step with requests waiting (a full batch, prefills of
    the admitted ones included), per second, over the decode tokens a request of the mix
    needs (output length - 1)."""
    mix = mixed_arrivals(1.0, 4.0 * args.burst, False, args, args.seed + 99)[: args.burst]
    burst = [Arrival(0.0, a.prompt_len, a.output_len) for a in mix]
    with served(args, db) as s:
        session, _ = record(s, burst, args.seed)
    steps = q.steps(store, session, limit=STEP_LIMIT)
    first = next(i for i, st in enumerate(steps) if st["queue"]["finished"])
    last = max(i for i, st in enumerate(steps) if st["queue"]["waiting"])
    if last - first < MIN_WINDOW:
        raise RuntimeError(f"{max(0, last - first)} saturated steps: raise --burst")
    decoded = sum(st["batch"]["num_decode_tokens"] for st in steps[first + 1 : last + 1])
    per_request = statistics.fmean(a.output_len - 1 for a in burst)
    return decoded / per_request / (steps[last]["t"] - steps[first]["t"])


def record(s: Served, arrivals: list[Arrival], seed: int) -> tuple[str, dict[str, Any]]:
    """Drive the server with `arrivals` through the load generator; its session id (the
    server's own) and the load summary."""
    summary = asyncio.run(run_load(s.url, arrivals, seed=seed))
    if summary["errors"]:
        raise RuntimeError(f"load errors: {summary['error_messages']}")
    s.requests += summary["ok"]
    settle(s)
    return str(s.status()["recorder"]["main_session"]), summary


def read(store: Store, session: str) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """A recorded session as `storage.queries` returns it: summary, steps, requests."""
    return (
        q.get_session(store, session),
        q.steps(store, session, limit=STEP_LIMIT),
        q.requests(store, session),
    )


def measured(steps: list[dict[str, Any]], records: list[dict[str, Any]]) -> dict[str, Any]:
    """`tuning.twin.outcome` of a recorded run."""
    return outcome(records, step_totals(steps))


def rerun(s: Served, store: Store, session: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """One real rerun of `session` under `knobs` (PATCHed first): its outcome and wall time."""
    s.client.patch("/api/knobs", json=knobs, params={"origin": "twin-bench"}).raise_for_status()
    resp = s.client.post(f"/api/sessions/{session}/rerun")
    resp.raise_for_status()
    new, requests = resp.json()["session"], resp.json()["requests"]
    wait_until(s, lambda st: st["recorder"]["session"] != new, f"rerun {new}")
    info = s.client.get(f"/api/sessions/{new}").json()
    if info["rerun"]["failed"] or info["knobs"] != knobs:
        raise RuntimeError(f"rerun {new} failed or ran other knobs: {info}")
    s.requests += requests
    settle(s)
    _, steps, records = read(store, new)
    return {"session": new, "wall_s": info["duration_s"], **measured(steps, records)}


def settings(twin: Twin, steps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The knob settings tried on a session, as changes to its knobs. Two follow what the
    recording used: half its peak running requests as slots (at least 4), and half its
    peak KV blocks as capacity (preemptions; at least what the longest request needs)."""
    need = twin.context["min_blocks"]
    slots = max(4, max(step["queue"]["running"] for step in steps) // 2)
    kv = max(need + 1, max(step["kv"]["used"] for step in steps) // 2)
    return {
        "defaults": {},
        f"{slots} slots": {"max_num_seqs": slots},
        "budget 256": {"max_num_batched_tokens": 256, "prefill_chunk_size": 256},
        "chunk 64": {"prefill_chunk_size": 64},
        "shortest_first": {"policy": "shortest_first"},
        f"KV {kv} blocks": {"kv_capacity_blocks": kv},
        "expert capacity 1.25": {"expert_capacity_factor": 1.25},
    }


def predict(twin: Twin, changes: dict[str, Any]) -> dict[str, Any]:
    """The twin's outcome under the session's knobs with `changes`, and the time it took."""
    knobs = twin.candidate(changes)
    start = time.perf_counter()
    result = twin.run(knobs)
    sim_s = time.perf_counter() - start
    return {
        "knobs": knobs.model_dump(),
        "sim_s": sim_s,
        "sim_steps": result.num_steps,
        "sim_end_s": result.end_s,
        "outside_share": result.outside_steps / max(1, result.num_steps),
        "metrics": sim_outcome(result),
    }


def measure(
    s: Served, store: Store, session: str, knobs: dict[str, dict[str, Any]], reruns: int
) -> dict[str, list[dict[str, Any]]]:
    """`reruns` real reruns of each setting, in rounds; each round starts at another setting,
    so that drift over the runs falls evenly on all of them."""
    names = list(knobs)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(reruns):
        shift = r * len(names) // reruns
        for name in names[shift:] + names[:shift]:
            run = rerun(s, store, session, knobs[name])
            runs[name].append(run)
            print(
                f"  rerun {r + 1}/{reruns} {name}: {run['wall_s']:.1f} s, "
                f"{num(run['throughput_tok_s']):.0f} tok/s",
                file=sys.stderr,
                flush=True,
            )
    return runs


def num(value: float | None) -> float:
    """A metric as a float (NaN for none, which no comparison meets)."""
    return math.nan if value is None else float(value)


def moves(value: float, base: float) -> bool:
    """Whether `value` is `MOVE` times `base` or more, either way (0 against non-zero is)."""
    lo, hi = sorted((abs(value), abs(base)))
    return hi > 0 and (lo == 0 or hi / lo >= MOVE)


def cell(
    predicted: float | None, runs: list[float], default_median: float | None
) -> dict[str, Any]:
    """One prediction against its reruns: median, spread, error and the checks (whether the
    setting moves it 2x only given the defaults' median)."""
    median, spread = num(percentile(runs, 50)), max(runs) - min(runs)
    pred = num(predicted)
    error = abs(pred - median)
    relative = error / abs(median) if median else (0.0 if error == 0 else math.inf)
    moved = default_median is not None and moves(median, default_median)
    return {
        "predicted": pred,
        "median": median,
        "spread": spread,
        "runs": runs,
        "error": error,
        "relative": relative,
        "within": error <= max(spread, NOISE_SHARE * abs(median)),
        "moved": moved,
        "moved_within": moved and relative <= MOVED_SHARE,
    }


def judge(
    predicted: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """Per setting: a `cell` per metric and for the drop rate, and the speed ratio."""
    defaults = {m: num(percentile([num(r[m]) for r in runs["defaults"]], 50)) for m in METRICS}
    out = {}
    for name, pred in predicted.items():
        cells = {
            m: cell(pred["metrics"][m], [num(r[m]) for r in runs[name]], defaults[m])
            for m in METRICS
        }
        drop = cell(pred["metrics"]["drop_rate"], [r["drop_rate"] for r in runs[name]], None)
        wall = num(percentile([r["wall_s"] for r in runs[name]], 50))
        out[name] = {
            **pred,
            "reruns": runs[name],
            "cells": cells,
            "drop": {**drop, "met": 100 * drop["error"] <= DROP_PP},
            "rerun_s": wall,
            "speed": wall / pred["sim_s"],
        }
    return out


def ranking(settings_judged: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per metric: the setting pairs whose reruns do not overlap, and how many of them the twin
    orders the same way."""
    out = {}
    for m in METRICS:
        agree = pairs = 0
        for a, b in itertools.combinations(settings_judged.values(), 2):
            ca, cb = a["cells"][m], b["cells"][m]
            if max(ca["runs"]) < min(cb["runs"]) or max(cb["runs"]) < min(ca["runs"]):
                pairs += 1
                same = (ca["predicted"] - cb["predicted"]) * (ca["median"] - cb["median"]) > 0
                agree += same
        out[m] = {"agree": agree, "pairs": pairs}
    return out


def built(store: Store, session: str) -> tuple[Twin, dict[str, Any], list[Any], list[Any]]:
    """The twin of a recorded session, its cost model's fit (with the time to build it), and
    the session's steps and requests."""
    info, steps, records = read(store, session)
    start = time.perf_counter()
    twin = twin_from_recording(info, steps, records)
    fit = {
        "session": session,
        "mape": twin.model.mape,
        "steps": twin.model.num_steps,
        "build_s": time.perf_counter() - start,
    }
    return twin, fit, steps, records


def judge_twin(
    fit: dict[str, Any],
    predicted: dict[str, dict[str, Any]],
    runs: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """One twin's predictions judged against the reruns: its fit, settings and ranking."""
    settings_judged = judge(predicted, runs)
    return {"fit": fit, "settings": settings_judged, "ranking": ranking(settings_judged)}


def run_session(
    args: argparse.Namespace, store: Store, db: str, load: Load, capacity: float
) -> dict[str, Any]:
    """Record one session, rerun it once under its own knobs to fit the twin that is judged,
    predict each setting with that twin, rerun each for real; judged, and judged again for the
    twin of the recording itself (`from_recording`, a diagnostic)."""
    rate = load.load * capacity
    arrivals = mixed_arrivals(
        rate, args.duration, load.burst, args, args.seed + 10 * LOADS.index(load)
    )
    print(f"session {load.name}: {len(arrivals)} requests at {rate:.2f} req/s", file=sys.stderr)
    with served(args, db) as s:
        session, summary = record(s, arrivals, args.seed)
        rec_twin, rec_fit, steps, records = built(store, session)
        # The twin is judged against reruns, so it learns from one: reruns submit random-token
        # prompts straight to the engine, while the recording streamed word prompts over HTTP
        # (a slower engine thread, other expert routing). This rerun is not one of the measured.
        base = rerun(s, store, session, rec_twin.knobs.model_dump())
        twin, fit, _, _ = built(store, base["session"])
        changes = settings(twin, steps)
        if args.quick:
            changes = dict(itertools.islice(changes.items(), QUICK_SETTINGS))
        predicted = {name: predict(twin, c) for name, c in changes.items()}
        knobs = {name: p["knobs"] for name, p in predicted.items()}
        round_s = sum(p["sim_end_s"] for p in predicted.values())
        print(f"  the twin expects a round of reruns to take {round_s:.0f} s", file=sys.stderr)
        runs = measure(s, store, session, knobs, args.reruns)
    from_recording = {name: predict(rec_twin, c) for name, c in changes.items()}
    return {
        "name": load.name,
        "load": load.load,
        "burst": load.burst,
        "rate_req_s": rate,
        "requests": len(arrivals),
        "load_summary": summary,
        "recorded": {
            "session": session,
            "steps": len(steps),
            "peak_waiting": max(step["queue"]["waiting"] for step in steps),
            "peak_running": max(step["queue"]["running"] for step in steps),
            **measured(steps, records),
        },
        **judge_twin(fit, predicted, runs),
        "from_recording": judge_twin(rec_fit, from_recording, runs),
    }


def pooled(sessions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Ranking per metric over every session, and over every metric ("overall")."""
    out: dict[str, dict[str, Any]] = {}
    for m in (*METRICS, "overall"):
        keys = METRICS if m == "overall" else (m,)
        agree = sum(s["ranking"][k]["agree"] for s in sessions for k in keys)
        pairs = sum(s["ranking"][k]["pairs"] for s in sessions for k in keys)
        out[m] = {"agree": agree, "pairs": pairs, "share": agree / pairs if pairs else None}
    return out


def target_values(sessions: list[dict[str, Any]], ranks: dict[str, Any]) -> dict[str, Any]:
    """Each target's value over every session and setting (None: nothing to judge)."""
    rows = [j for s in sessions for j in s["settings"].values()]
    cells = [c for j in rows for c in j["cells"].values()]
    moved = [c for c in cells if c["moved"]]
    values = {
        "noise": sum(c["within"] for c in cells) / len(cells),
        "moved": sum(c["moved_within"] for c in moved) / len(moved) if moved else None,
        "drop": max(100 * j["drop"]["error"] for j in rows),
        "ranking": ranks["overall"]["share"],
        "speed": min(j["speed"] for j in rows),
    }
    return {
        key: {"value": v, "met": v is not None and TARGETS[key].met(v)} for key, v in values.items()
    }


def verdict(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The pooled ranking and the targets of one twin per session (`judge_twin`'s)."""
    ranks = pooled(parts)
    return {"ranking": ranks, "targets": target_values(parts, ranks)}


LABELS = {  # column heading and decimals
    "throughput_tok_s": ("out tok/s", 0),
    "ttft_p50_ms": ("TTFT p50 ms", 0),
    "ttft_p90_ms": ("TTFT p90 ms", 0),
    "tpot_p50_ms": ("TPOT p50 ms", 1),
    "tpot_p90_ms": ("TPOT p90 ms", 1),
    "peak_kv_blocks": ("peak KV blocks", 0),
    "preemptions": ("preemptions", 0),
}


def mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def cell_text(c: dict[str, Any], digits: int, scale: float = 1.0) -> str:
    """`predicted / median ±spread ✓`, then `2x✓` where the setting moves the metric 2x."""
    pred, med, spread = (scale * c[k] for k in ("predicted", "median", "spread"))
    moved = f" 2x{mark(c['moved_within'])}" if c["moved"] else ""
    ok = c["met"] if "met" in c else c["within"]
    return f"{pred:.{digits}f} / {med:.{digits}f} ±{spread:.{digits}f} {mark(ok)}{moved}"


def session_table(s: dict[str, Any]) -> list[str]:
    """One row per setting: each metric predicted against measured, the speed."""
    rec = s["recorded"]
    heads = " | ".join(label for label, _ in LABELS.values())
    lines = [
        f"Session `{s['name']}`: predicted / measured median ±spread of "
        f"{len(next(iter(s['settings'].values()))['reruns'])} rerun(s).",
        "",
        f"| setting | {heads} | drop rate % | sim ms (steps) | rerun s | speed |",
        "| --- |" + " --- |" * (len(LABELS) + 4),
        "| recorded (load generator) | "
        + " | ".join(f"{num(rec[m]):.{d}f}" for m, (_, d) in LABELS.items())
        + f" | {100 * rec['drop_rate']:.2f} | | | |",
    ]
    for name, j in s["settings"].items():
        cells = " | ".join(cell_text(j["cells"][m], d) for m, (_, d) in LABELS.items())
        outside = f", {100 * share:.0f}% outside" if (share := j["outside_share"]) else ""
        lines.append(
            f"| {name} | {cells} | {cell_text(j['drop'], 2, 100)} | "
            f"{1000 * j['sim_s']:.0f} ({j['sim_steps']}{outside}) | {j['rerun_s']:.1f} | "
            f"{j['speed']:.0f}x |"
        )
    return lines


def overview(out: dict[str, Any]) -> list[str]:
    """One row per session: its load, what was recorded and its cost model."""
    lines = [
        "| session | load x capacity | req/s | 3x burst | requests | recorded steps | "
        "peak waiting / running | cost model: steps, MAPE | twin build s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in out["sessions"]:
        rec, fit = s["recorded"], s["fit"]
        lines.append(
            f"| {s['name']} | {s['load']:g} | {s['rate_req_s']:.2f} | "
            f"{'yes' if s['burst'] else 'no'} | {s['requests']} | {rec['steps']} | "
            f"{rec['peak_waiting']} / {rec['peak_running']} | {fit['steps']}, "
            f"{100 * fit['mape']:.1f}% | {fit['build_s']:.2f} |"
        )
    return lines


def ranking_table(out: dict[str, Any]) -> list[str]:
    """Per metric and session: pairs ordered as the reruns order them / pairs judged."""
    names = [s["name"] for s in out["sessions"]]
    lines = [
        f"| metric | {' | '.join(names)} | all sessions |",
        "| --- |" + " --- |" * (len(names) + 1),
    ]
    for m in (*METRICS, "overall"):
        per = [
            "-" if m == "overall" else f"{s['ranking'][m]['agree']}/{s['ranking'][m]['pairs']}"
            for s in out["sessions"]
        ]
        r = out["ranking"][m]
        share = "-" if r["share"] is None else f"{100 * r['share']:.0f}%"
        label = LABELS[m][0] if m in LABELS else "**overall**"
        lines.append(f"| {label} | {' | '.join(per)} | {r['agree']}/{r['pairs']} ({share}) |")
    return lines


SHOWN = {  # how each target's value reads
    "noise": lambda v: f"{100 * v:.0f}%",
    "moved": lambda v: f"{100 * v:.0f}%",
    "drop": lambda v: f"{v:.2f} pp",
    "ranking": lambda v: f"{100 * v:.0f}%",
    "speed": lambda v: f"{v:.0f}x",
}


def target_lines(targets: dict[str, Any]) -> list[str]:
    lines = []
    for key, target in TARGETS.items():
        value = targets[key]["value"]
        if value is None:
            lines.append(f"- [n/a] {target.text}: nothing to judge (target {target.bound})")
        else:
            lines.append(target.line(value, SHOWN[key](value)))
    return lines


def diagnostic_table(out: dict[str, Any]) -> list[str]:
    """The targets for the judged twin (of a defaults rerun) against those for the twin of
    each recording."""

    def shown(targets: dict[str, Any], key: str) -> str:
        value = targets[key]["value"]
        return "-" if value is None else f"{SHOWN[key](value)} {mark(targets[key]['met'])}"

    lines = [
        "| target | twin of a defaults rerun (judged) | twin of the recording |",
        "| --- | --- | --- |",
        *(
            f"| {t.text} ({t.bound}) | {shown(out['targets'], k)} | "
            f"{shown(out['from_recording']['targets'], k)} |"
            for k, t in TARGETS.items()
        ),
    ]
    for s in out["sessions"]:
        a, b = s["fit"], s["from_recording"]["fit"]
        lines.append(
            f"| cost model of `{s['name']}`: steps, MAPE | {a['steps']}, "
            f"{100 * a['mape']:.1f}% | {b['steps']}, {100 * b['mape']:.1f}% |"
        )
    return lines


def method_lines(args: argparse.Namespace, out: dict[str, Any]) -> list[str]:
    """How the section was measured."""
    capacity = (
        "given"
        if args.capacity
        else f"a burst of {args.burst} requests of the mix at once on a throwaway server: "
        "tokens decoded per second from the first request's end to the last step with "
        "requests waiting, over the mean output length - 1"
    )
    return [
        f"- Server: `moescope serve --model {args.model} --threads {args.threads} "
        "--no-metrics --db <temporary SQLite>` in a subprocess, a fresh one per session (its "
        "run is the recorded session); the load generator and the twin run in the benchmark "
        "process, never at the same time as a rerun. The cores are shared with other "
        "workers, so absolute numbers are noisy",
        f"- Capacity: {out['capacity_req_s']:.2f} req/s ({capacity}). Sessions: "
        f"{args.duration:g} s of Poisson arrivals (`cli/loadgen.py`, streaming "
        f"`/v1/completions`) at load x capacity; prompts `{args.prompt_len}`, "
        f"{100 * args.long_share:g}% of them `{args.long_prompt_len}`; outputs "
        f"`{args.output_len}`; a 3x burst adds twice the rate for {BURST_SHARE:.2f} of the "
        f"duration from {BURST_AT:g} of it; seed {args.seed}.",
        "- Settings: the defaults; N slots (`max_num_seqs`: half the session's peak "
        "running requests, at least 4); budget 256 (`max_num_batched_tokens` and "
        "`prefill_chunk_size` 256); chunk 64 (`prefill_chunk_size`); shortest_first "
        "(`policy`); KV N blocks (`kv_capacity_blocks`: half the session's peak KV blocks, at "
        "least what its longest request needs); expert capacity 1.25 "
        "(`expert_capacity_factor`).",
        "- Predicted: `tuning.twin.whatif.twin_from_recording` on one extra rerun of the session "
        "under its own knobs (not one of the measured reruns; cost model fitted on its steps, "
        "expert loads drawn from its routing), then `Twin.run` per setting. The twin learns "
        "from a rerun because it is judged against reruns: the recording ran over HTTP (word "
        "prompts, every token streamed, a slower engine thread, other expert routing). The "
        "twin of the recording itself is judged too, as a diagnostic. Sim ms is a run's time "
        "(the build, once per session, is apart), with its simulated steps and the share "
        "of them far beyond what the cost model was fitted on (`outside`).",
        f"- Measured: {args.reruns} real rerun(s) per setting (PATCH /api/knobs, POST "
        "/api/sessions/{id}/rerun at speed 1), in rounds that start at a different setting; "
        "the median and spread (max - min) of the reruns' `tuning.twin.outcome` metrics, each "
        "computed from that rerun's recorded steps and requests; rerun s is the median of "
        "their wall times and speed its ratio to sim ms. The recorded session itself ran "
        "over HTTP (word prompts, every token streamed to its client, the load generator "
        "on the other core); reruns submit synthesized prompts to the engine loop, so its "
        "row is context, not a measurement.",
        "- A cell is `predicted / measured median ±spread`, ✓ when within max(spread, 15% of "
        "the median); `2x✓`/`2x✗` marks a setting that moves the metric 2x or more from the "
        "defaults' median, checked within 25%. The drop rate is checked within 1 "
        "percentage point.",
    ]


def render(args: argparse.Namespace, argv: list[str], out: dict[str, Any], total_s: float) -> str:
    command = ["python", "-m", "benchmarks.control.twin", *argv]
    lines = [
        header(
            "What-if twin accuracy (`benchmarks/control/twin.py`)",
            command,
            total_s,
            machine.measure(),
        ),
        *method_lines(args, out),
        "",
        *overview(out),
    ]
    for s in out["sessions"]:
        lines += ["", *session_table(s)]
    lines += [
        "",
        "Ranking: setting pairs (within a session) whose reruns do not overlap, and how many "
        "of them the twin orders the same way:",
        "",
        *ranking_table(out),
        "",
        "Diagnostic: the same checks for a twin built from each session's first rerun of the "
        "defaults instead of its recording (the reruns' own conditions: synthesized prompts, "
        "no HTTP, no load generator beside the server; its prediction of the defaults is in "
        "sample):",
        "",
        *diagnostic_table(out),
        "",
        "Targets (the twin of the recording):",
        "",
        *target_lines(out["targets"]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure and publish; returns the capacity, each session (recording, fit, and per
    setting the prediction, the reruns and the checks), the ranking and the targets."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.perf_counter()
    loads = [load for load in LOADS if load.name in args.sessions.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'twin.db'}"
        store = Store(db)
        try:
            capacity = args.capacity or measure_capacity(args, store, db)
            print(f"capacity: {capacity:.2f} req/s", file=sys.stderr, flush=True)
            sessions = [run_session(args, store, db, load, capacity) for load in loads]
        finally:
            store.close()
    out = {
        "capacity_req_s": capacity,
        "sessions": sessions,
        **verdict(sessions),
        "from_recording": verdict([s["from_recording"] for s in sessions]),
    }
    section = render(args, argv, out, time.perf_counter() - started)
    publish(SECTION, section, results_path(args))
    return out


if __name__ == "__main__":
    main()
