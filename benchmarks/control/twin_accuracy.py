"""The what-if twin's bands on loads it was not tuned to, against replays over HTTP.

What it measures. For each of three load shapes (uniform lengths; long-tailed lognormal
lengths; bursts with long prompts) the arrivals are drawn once (seeded) and sent over HTTP
(`cli/loadgen.py`, as `moescope load --trace` sends a trace) to a fresh `moescope serve`
(`synthetic:small`, one torch thread) that records them: twice, into two sessions of the
same engine, one before the replays and one after them. The twin is the pooled twin of
those two recordings (`tuning.twin.whatif.twin_from_recordings`); it predicts each of the
shape's settings as a median and an 80% band over its simulations (`tuning.twin.bands`),
with the share of them in which the queue builds. The ground truth is the median of three
replays of the same arrivals (their times and lengths; each replay's prompts its own words,
so that none hits the prefix cache another left) over HTTP to one server under each setting,
PATCHed before each replay, measured by the load generator as a user measures it; the
rounds start at a different setting, so that drift falls evenly on all, after the server
warmed up on the first WARMUP_S of the arrivals (a user's server has run before: a fresh
one's first step took 0.8-3 s, and the queue it left was all the first replay measured).
The defaults' three replays give the A/A floor per metric: their spread (max - min) over
their median.

Reported, per shape and setting and metric: the band against the measured median (covered
or not), the point error against max(A/A, 15%), the ranking of the setting pairs whose
measured medians differ by more than the A/A floor, the speed (a what-if with its bands
against the load's wall time), and each saturation flag against the replays (flagged "the
queue builds" should mean a measured TTFT p90 at least 3x the defaults').

Every finished recording and replay is cached under `--cache` (a rerun resumes where it
stopped; `--fresh` starts over). The cores are shared with other work: loads are short
(`--duration`, 20 s) and the log prints each replay as it ends. Run:
`python -m benchmarks.control.twin_accuracy`; `--shapes uniform` runs fewer, `--quick` is a
smoke run on synthetic:tiny (one 3 s shape, three settings, one replay) that writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from benchmarks.harness.targets import Target
from benchmarks.speed.serving import server
from cli.loadgen import Arrival, parse_dist, poisson_arrivals, run_load
from engine.knobs import Knobs
from stats import percentile
from storage import Store
from storage import queries as q
from tuning.twin.bands import SATURATED
from tuning.twin.trace import blocks_needed, trace_of
from tuning.twin.whatif import Twin, twin_from_recordings

SECTION = "twin_accuracy"
METRICS = ("throughput_tok_s", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")
NOISE_SHARE = 0.15  # a point prediction may be off by max(A/A, this share)
SATURATED_X = 3.0  # a flagged setting's measured TTFT p90 is this many times the defaults'
TARGETS = {
    "coverage_low": Target("lowest band coverage of a metric, share", 0.7),
    "coverage_high": Target("highest band coverage of a metric, share", 0.9, False),
    "point": Target("point predictions within max(A/A, 15%), share", 0.85),
    "ranking": Target("pairs differing beyond A/A ranked right, share", 0.9),
    "speed": Target("smallest ratio of the load's wall time to a what-if's", 100.0),
    "saturation": Target("saturation flags that the replays agree with, share", 1.0),
}
STATUS_POLL_S = 0.25
RECORDINGS = 2  # sessions of the defaults the twin pools
WARMUP_S = 3.0  # of the arrivals sent to the replay server, unmeasured, before its replays
WARMUP_SEED, REPLAY_SEEDS = 99, 1000  # past the recordings' seeds (seed + 0, 1, ...)


@dataclass(frozen=True)
class Shape:
    name: str
    rate: float  # req/s
    prompt: str
    output: str
    long_share: float = 0.0  # of prompts drawn from `long`
    long: str = "uniform:800:1600"
    bursts: bool = False  # every BURST_EVERY s, BURST_S s at BURST_X times the rate


BURST_EVERY, BURST_S, BURST_X = 6.0, 1.5, 4.0
SHAPES = (
    Shape("uniform", 8.0, "uniform:16:256", "uniform:16:96"),
    Shape("long-tailed", 6.0, "lognormal:128:1.0:1800", "lognormal:48:0.8:256"),
    Shape("bursty long", 2.0, "uniform:16:256", "uniform:16:64", 0.4, bursts=True),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic:small")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals a load")
    p.add_argument("--replays", type=int, default=3, help="replays of each setting")
    p.add_argument("--shapes", default=",".join(s.name for s in SHAPES))
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", type=Path, default=Path("/tmp/moescope-twin-accuracy"))
    p.add_argument("--fresh", action="store_true", help="drop the cache first")
    p.add_argument("--quick", action="store_true", help="synthetic:tiny, one short shape")
    p.add_argument("--measure-only", action="store_true", help="record and replay, no twin")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.duration, args.replays, args.shapes = "synthetic:tiny", 3.0, 1, "uniform"
        args.cache = args.cache.with_name(args.cache.name + "-quick")
    return args


def arrivals_of(shape: Shape, duration: float, seed: int) -> list[Arrival]:
    """The shape's arrivals: Poisson at its rate, a `long_share` of prompts long, and with
    `bursts` extra arrivals at BURST_X times the rate for BURST_S of every BURST_EVERY s."""
    prompt, long, output = (parse_dist(x) for x in (shape.prompt, shape.long, shape.output))
    rate = shape.rate * (1 - shape.long_share)
    streams = [list(poisson_arrivals(rate, duration, prompt, output, seed))]
    if shape.long_share:
        long_rate = shape.rate * shape.long_share
        streams.append(list(poisson_arrivals(long_rate, duration, long, output, seed + 1)))
    if shape.bursts:
        for k, start in enumerate(itertools.takewhile(lambda t: t < duration, _every())):
            extra = poisson_arrivals(BURST_X * shape.rate, BURST_S, prompt, output, seed + 9 + k)
            streams.append(
                [Arrival(round(start + a.t, 6), a.prompt_len, a.output_len) for a in extra]
            )
    return sorted(itertools.chain(*streams), key=lambda a: a.t)


def _every() -> Iterator[float]:
    t = BURST_EVERY / 2
    while True:
        yield t
        t += BURST_EVERY


def settings(shape: Shape, need_blocks: int, peak_blocks: int) -> dict[str, dict[str, Any]]:
    """Changes to the defaults tried on a shape: fewer slots, a small budget and chunk,
    shortest-first with fewer slots, a KV cap (half the recordings' peak, at least the
    longest request's need) with recompute and with swap, and few slots (near the knee)."""
    kv = max(need_blocks + 2, peak_blocks // 2)
    return {
        "defaults": {},
        "16 slots": {"max_num_seqs": 16},
        "budget 256": {"max_num_batched_tokens": 256, "prefill_chunk_size": 256},
        "shortest_first, 16 slots": {"policy": "shortest_first", "max_num_seqs": 16},
        f"KV {kv} recompute": {"kv_capacity_blocks": kv},
        f"KV {kv} swap": {"kv_capacity_blocks": kv, "preemption_mode": "swap"},
        "6 slots": {"max_num_seqs": 6},
    }


class Cache:
    """JSON files under one folder per shape and run configuration."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> Any:
        path = self.root / f"{key}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def put(self, key: str, value: Any) -> None:
        tmp = self.root / f"{key}.json.tmp"
        tmp.write_text(json.dumps(value))
        tmp.replace(self.root / f"{key}.json")


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def status(client: httpx.Client) -> dict[str, Any]:
    resp = client.get("/api/status")
    resp.raise_for_status()
    return resp.json()


def wait_idle(client: httpx.Client, recorded: int = 0, timeout_s: float = 900.0) -> None:
    """Until the engine is idle and (recording) the recorder has written `recorded` requests."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = status(client)
        rec = st.get("recorder") or {}
        written = rec.get("written_requests", 0) + rec.get("dropped_requests", 0)
        idle = not any(st["queue"].values()) and not rec.get("pending_steps")
        if idle and written >= recorded:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not settle")
        time.sleep(STATUS_POLL_S)


def load(url: str, arrivals: list[Arrival], seed: int) -> dict[str, Any]:
    summary = asyncio.run(run_load(url, arrivals, seed=seed))
    if summary["errors"] or summary["cancelled"]:
        raise RuntimeError(f"load errors: {summary['error_messages']}")
    return summary


def measured(summary: dict[str, Any], first_arrival_s: float) -> dict[str, Any]:
    """METRICS as the load generator measured them; out tok/s as the twin counts it
    (`tuning.twin.outcome`): over the span from the first arrival, not from the load's start
    (`first_arrival_s` earlier: 1-2% of a 20 s load, more than the A/A spread)."""
    span = summary["duration_s"] - first_arrival_s
    return {
        "throughput_tok_s": summary["output_tokens"] / span,
        "ttft_p50_ms": summary["ttft_ms"]["p50"],
        "ttft_p90_ms": summary["ttft_ms"]["p90"],
        "tpot_p50_ms": summary["tpot_ms"]["p50"],
        "tpot_p90_ms": summary["tpot_ms"]["p90"],
        "wall_s": summary["duration_s"],
    }


@contextlib.contextmanager
def serving(args: argparse.Namespace, db: str) -> Iterator[tuple[str, httpx.Client]]:
    with (
        server(args.model, args.threads, False, [], db) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        yield url, client


def recordings(
    args: argparse.Namespace, cache: Cache, arrivals: list[Arrival], count: int
) -> list[str]:
    """`count` sessions of `arrivals` under the defaults, each on a fresh recording server
    (its run is one session) into the cache's database; their ids."""
    db = f"sqlite:///{cache.root / 'recorded.db'}"
    ids: list[str] = cache.get("recordings") or []
    while len(ids) < count:
        with serving(args, db) as (url, client):
            load(url, arrivals, args.seed + len(ids))
            wait_idle(client, len(arrivals))
            ids.append(str(status(client)["recorder"]["main_session"]))
        cache.put("recordings", ids)
        say(f"  recorded session {ids[-1]}")
    return ids


def recorded_sessions(cache: Cache, ids: list[str]) -> list[Any]:
    """The recordings `ids` as `storage.queries.recording` reads them."""
    store = Store(f"sqlite:///{cache.root / 'recorded.db'}")
    try:
        return [q.recording(store, sid) for sid in ids]
    finally:
        store.close()


def replays(
    args: argparse.Namespace, cache: Cache, arrivals: list[Arrival], knobs: dict[str, dict]
) -> dict[str, list[dict[str, Any]]]:
    """`--replays` replays of `arrivals` under each knob set on one server, in rounds that
    start at a different setting; each cached as it ends."""
    names = list(knobs)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    todo = []
    for r in range(args.replays):
        shift = r * len(names) // args.replays
        for name in names[shift:] + names[:shift]:
            key = f"replay-{_slug(name)}-{r}"
            if (done := cache.get(key)) is not None:
                runs[name].append(done)
            else:
                todo.append((r, name, key))
    if todo:
        db = f"sqlite:///{cache.root / 'replays.db'}"  # the server records; nothing reads it
        with serving(args, db) as (url, client):
            # a fresh server's first steps run 10-100x slower (allocations, thread pools):
            # unwarmed, the first replay (the defaults') measured that, not the settings
            load(url, [a for a in arrivals if a.t < WARMUP_S], args.seed + WARMUP_SEED)
            wait_idle(client)
            for n, (r, name, key) in enumerate(todo, 1):
                client.patch(
                    "/api/knobs", json=knobs[name], params={"origin": "twin-accuracy"}
                ).raise_for_status()
                seed = replay_seed(args.seed, r, names.index(name), len(names))
                run = measured(load(url, arrivals, seed), arrivals[0].t)
                wait_idle(client)
                cache.put(key, run)
                runs[name].append(run)
                say(
                    f"  replay {n}/{len(todo)} {name} (round {r + 1}): {run['wall_s']:.1f} s, "
                    f"TTFT p90 {run['ttft_p90_ms']:.0f} ms, TPOT p50 {run['tpot_p50_ms']:.1f} ms"
                )
    return runs


def replay_seed(seed: int, round_: int, setting: int, settings: int) -> int:
    """The load seed of a replay: its prompts are words of its own, since the same words again
    hit the prefix cache that the replays before left (46-52% of prompt tokens did), which
    the twin of the recordings (each on a fresh server, seeds `seed` + 0, 1, ...) never sees."""
    return seed + REPLAY_SEEDS + round_ * settings + setting


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def num(value: float | None) -> float:
    return math.nan if value is None else float(value)


def aa_floor(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per metric: the spread of the defaults' replays over their median."""
    out = {}
    for m in METRICS:
        values = [num(r[m]) for r in runs]
        median = num(percentile(values, 50))
        out[m] = (max(values) - min(values)) / abs(median) if median else 0.0
    return out


def judge_shape(
    twin: Twin,
    knobs: dict[str, dict[str, Any]],
    changes: dict[str, dict[str, Any]],
    runs: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Each setting's banded prediction against its replays."""
    floor = aa_floor(runs["defaults"])
    base_ttft = num(percentile([num(r["ttft_p90_ms"]) for r in runs["defaults"]], 50))
    out: dict[str, Any] = {"aa": floor, "settings": {}}
    for name, change in changes.items():
        start = time.perf_counter()
        predicted = twin.predict(change)
        what_if_s = time.perf_counter() - start
        wall = num(percentile([r["wall_s"] for r in runs[name]], 50))
        cells: dict[str, dict[str, Any]] = {}
        for m in METRICS:
            values = [num(r[m]) for r in runs[name]]
            median = num(percentile(values, 50))
            band = predicted["bands"][m]
            point = num(predicted[m])
            low, high = num(band[0]), num(band[1])
            error = abs(point - median) / abs(median) if median else math.inf
            cells[m] = {
                "predicted": point,
                "low": low,
                "high": high,
                "median": median,
                "runs": values,
                "covered": low <= median <= high,
                "error": error,
                "within": error <= max(floor[m], NOISE_SHARE),
            }
        sat = predicted["saturation"]
        measured_x = num(cells["ttft_p90_ms"]["median"]) / base_ttft if base_ttft else math.nan
        flagged = sat["share"] >= SATURATED
        out["settings"][name] = {
            "knobs": knobs[name],
            "cells": cells,
            "saturation": sat,
            "measured_ttft_x": measured_x,
            "flag_agrees": flagged == (measured_x >= SATURATED_X),
            "what_if_s": what_if_s,
            "wall_s": wall,
            "speed": wall / what_if_s,
        }
    out["ranking"] = ranking(out["settings"], floor)
    return out


def ranking(judged: dict[str, Any], floor: dict[str, float]) -> dict[str, dict[str, int]]:
    """Per metric: setting pairs whose measured medians differ by more than the A/A floor (of
    the larger), and how many of them the twin's medians order the same way."""
    out = {}
    for m in METRICS:
        agree = pairs = 0
        for a, b in itertools.combinations(judged.values(), 2):
            ca, cb = a["cells"][m], b["cells"][m]
            gap = abs(ca["median"] - cb["median"])
            if gap > floor[m] * max(abs(ca["median"]), abs(cb["median"])):
                pairs += 1
                agree += (ca["predicted"] - cb["predicted"]) * (ca["median"] - cb["median"]) > 0
        out[m] = {"agree": agree, "pairs": pairs}
    return out


def run_shape(args: argparse.Namespace, shape: Shape) -> dict[str, Any]:
    cache = Cache(args.cache / _slug(shape.name))
    arrivals = arrivals_of(shape, args.duration, args.seed)
    say(f"shape {shape.name}: {len(arrivals)} requests over {args.duration:g} s")
    # one recording before the replays and the rest after: the machine's other work comes
    # and goes, and the twin, pooled from both, is fitted over the replays' own span of time
    first = recordings(args, cache, arrivals, 1)[:1]
    recorded = recorded_sessions(cache, first)
    peak = max(s["kv"]["used"] for _, steps, _ in recorded for s in steps)
    block_size = recorded[0][0]["config"]["engine_config"]["cache"]["block_size"]
    max_len = recorded[0][0]["config"]["model_config"]["max_model_len"]
    need = blocks_needed(trace_of(recorded[0][2]), block_size, max_len)
    changes = settings(shape, need, peak)
    if args.quick:
        changes = dict(itertools.islice(changes.items(), 3))
    knobs = {
        name: Knobs(**{**recorded[0][0]["knobs"], **c}).model_dump() for name, c in changes.items()
    }
    runs = replays(args, cache, arrivals, knobs)
    ids = recordings(args, cache, arrivals, RECORDINGS)
    if args.measure_only:
        return {}
    recorded = recorded_sessions(cache, ids)
    start = time.perf_counter()
    twin = twin_from_recordings(recorded)
    build_s = time.perf_counter() - start
    say(f"  predicting {len(changes)} settings")
    judged = judge_shape(twin, knobs, changes, runs)
    return {
        "shape": asdict(shape),
        "requests": len(arrivals),
        "sessions": ids,
        "fit": {"steps": twin.model.num_steps, "mape": twin.model.mape, "build_s": build_s},
        **judged,
    }


def target_values(shapes: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [j for s in shapes for j in s["settings"].values()]
    coverage = {m: sum(j["cells"][m]["covered"] for j in rows) / len(rows) for m in METRICS}
    cells = [c for j in rows for c in j["cells"].values()]
    agree = sum(s["ranking"][m]["agree"] for s in shapes for m in METRICS)
    pairs = sum(s["ranking"][m]["pairs"] for s in shapes for m in METRICS)
    values = {
        "coverage_low": min(coverage.values()),
        "coverage_high": max(coverage.values()),
        "point": sum(c["within"] for c in cells) / len(cells),
        "ranking": agree / pairs if pairs else None,
        "speed": min(j["speed"] for j in rows),
        "saturation": sum(j["flag_agrees"] for j in rows) / len(rows),
    }
    out = {k: {"value": v, "met": v is not None and TARGETS[k].met(v)} for k, v in values.items()}
    return {"coverage": coverage, "pairs": {"agree": agree, "pairs": pairs}, "targets": out}


LABELS = {
    "throughput_tok_s": ("out tok/s", 0),
    "ttft_p50_ms": ("TTFT p50 ms", 0),
    "ttft_p90_ms": ("TTFT p90 ms", 0),
    "tpot_p50_ms": ("TPOT p50 ms", 1),
    "tpot_p90_ms": ("TPOT p90 ms", 1),
}


def mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def cell_text(c: dict[str, Any], d: int) -> str:
    """`median [low, high] / measured covered within`."""
    return (
        f"{c['predicted']:.{d}f} [{c['low']:.{d}f}, {c['high']:.{d}f}] / {c['median']:.{d}f} "
        f"{mark(c['covered'])}{mark(c['within'])}"
    )


def shape_table(s: dict[str, Any]) -> list[str]:
    sh, fit = s["shape"], s["fit"]
    aa = ", ".join(f"{LABELS[m][0]} {100 * v:.0f}%" for m, v in s["aa"].items())
    heads = " | ".join(label for label, _ in LABELS.values())
    lines = [
        f"Shape `{sh['name']}`: {sh['rate']:g} req/s, prompts `{sh['prompt']}`"
        + (f" ({100 * sh['long_share']:g}% `{sh['long']}`)" if sh["long_share"] else "")
        + f", outputs `{sh['output']}`{', bursts' if sh['bursts'] else ''}; {s['requests']} "
        f"requests; twin pooled from {len(s['sessions'])} recordings ({fit['steps']} steps, "
        f"MAPE {100 * fit['mape']:.0f}%). A/A floor: {aa}.",
        "",
        f"| setting | {heads} | queue builds | TTFT p90 x defaults | what-if s | speed |",
        "| --- |" + " --- |" * (len(LABELS) + 4),
    ]
    for name, j in s["settings"].items():
        cells = " | ".join(cell_text(j["cells"][m], d) for m, (_, d) in LABELS.items())
        sat = j["saturation"]
        lines.append(
            f"| {name} | {cells} | {sat['builds']}/{sat['draws']} {mark(j['flag_agrees'])} | "
            f"{j['measured_ttft_x']:.1f} | {j['what_if_s']:.2f} | {j['speed']:.0f}x |"
        )
    return lines


SHOWN = {
    "coverage_low": lambda v: f"{100 * v:.0f}%",
    "coverage_high": lambda v: f"{100 * v:.0f}%",
    "point": lambda v: f"{100 * v:.0f}%",
    "ranking": lambda v: f"{100 * v:.0f}%",
    "speed": lambda v: f"{v:.0f}x",
    "saturation": lambda v: f"{100 * v:.0f}%",
}


def render(args: argparse.Namespace, argv: list[str], out: dict[str, Any], total_s: float) -> str:
    command = ["python", "-m", "benchmarks.control.twin_accuracy", *argv]
    lines = [
        header(
            "What-if twin bands on unseen loads (`benchmarks/control/twin_accuracy.py`)",
            command,
            total_s,
            machine.measure(),
        ),
        f"- Server: `moescope serve --model {args.model} --threads {args.threads}` in a "
        "subprocess; loads sent over HTTP by `cli/loadgen.py` (streaming /v1/completions), "
        f"{args.duration:g} s of arrivals each. Twin: pooled from {RECORDINGS} recordings "
        "of the defaults; its median and 80% band over its simulations. Measured: the "
        f"median of {args.replays} replays per setting (one server, knobs PATCHed). The "
        "cores are shared with other workers' builds and tests while this ran.",
        "- A cell: `median [band] / measured` then ✓/✗ for covered by the band and for the "
        "point within max(A/A, 15%). Queue builds: simulations in which it did, ✓ when the "
        f"flag (>= {SATURATED:.0%}) agrees with a measured TTFT p90 >= {SATURATED_X:g}x "
        "the defaults'.",
    ]
    for s in out["shapes"]:
        lines += ["", *shape_table(s)]
    cov = ", ".join(f"{LABELS[m][0]} {100 * v:.0f}%" for m, v in out["coverage"].items())
    lines += [
        "",
        f"Band coverage per metric: {cov}. Pairs ranked: "
        f"{out['pairs']['agree']}/{out['pairs']['pairs']}.",
        "",
        "Targets:",
        "",
    ]
    for key, target in TARGETS.items():
        value = out["targets"][key]["value"]
        lines.append(
            f"- [n/a] {target.text}: nothing to judge"
            if value is None
            else target.line(value, SHOWN[key](value))
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.fresh and args.cache.exists():
        shutil.rmtree(args.cache)
    random.seed(args.seed)
    started = time.perf_counter()
    chosen = args.shapes.split(",")
    shapes = [run_shape(args, shape) for shape in SHAPES if shape.name in chosen]
    if args.measure_only:
        return {}
    out = {"shapes": shapes, **target_values(shapes)}
    (args.cache / "result.json").write_text(json.dumps(out, indent=1, default=str))
    section = render(args, argv, out, time.perf_counter() - started)
    publish(SECTION, section, results_path(args))
    return out


if __name__ == "__main__":
    main()
