"""The live twin's level: what it predicts at an autopilot's look against what then happened.

One seeded load of long prompts (`--rate` req/s of `--prompt-len` prompts for `--duration` s,
Poisson) is replayed on a fresh `moescope serve` each (recording into a temporary SQLite
file), under the defaults and under `--candidate`, `--repeats` times, interleaved. Then
every `--every` s from `--skip` s on, each recorded run is looked at as the autopilot looks
at it (`api/autopilot_runner.live_trials`), rebuilt from the recording at that moment:
- the queue: the requests that had arrived and not ended, running (with their output so far,
  spread evenly between their first token and their end) or waiting for a first token;
- the requests that had ended in the server's live window (KEEP_S), the cost model's rows of
  every step before (`FitRows`) and the expert loads of the last FIT_STEPS;
- `tuning.twin.live.twin_from_live` over `--horizon` s, asked as each ASKS says: the arrivals of
  the last 20 s (an ordinary look) or the last 5 s with the horizon stretched for
  MIN_SIMULATED requests (a shift's look) laid over it as `tuning.twin.live` does; and, to tell
  their error from the simulation's, with the arrivals that really came within the horizon.
The twin's SLO attainment for the run's own knobs is set against the measured one of the
same requests (those in the engine at the look and those arriving within the horizon),
counted as the twin counts them: a request running at the look by the TTFT and TPOT of its
tokens after the look, the rest by their own. The noise floor is the mean absolute
difference between two runs of the same knobs at the same look. The twin's predicted gain
of the candidate over the defaults (in the defaults' runs) is set against the measured one
(the candidate's runs against the defaults' at the same look).
Run: `python -m benchmarks.control.live_twin` (about 10 min; `--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import stats
from benchmarks.control.autopilot import serving, wait_recorded
from benchmarks.harness import machine
from benchmarks.harness.results_md import add_results_arguments, header, publish, results_path
from cli.loadgen import parse_dist, poisson_arrivals, run_load
from engine.knobs import Knobs
from engine.queue_snapshot import QueuedRequest, QueueSnapshot
from server.live_window import FIT_STEPS
from storage import Store
from storage import queries as q
from tuning.autopilot.pilot import MIN_SIMULATED, Measured, simulated
from tuning.twin.cost_model import knobs_after, stack
from tuning.twin.experts import routed, stacked
from tuning.twin.fit_rows import FitRows
from tuning.twin.live import arrival_window, stretched_horizon, twin_from_live
from tuning.twin.load_shift import SHIFT_S
from tuning.twin.outcome import request_tpot_ms
from tuning.twin.trace import TraceItem
from tuning.twin.tune import evaluate

SECTION = "live_twin"
KEEP_S = 70.0  # the ended requests a server's live window keeps (api/app.py)
ORDINARY, SHIFT, REAL = "ordinary look", "shift's look", "real arrivals"
# ask -> (seconds of arrivals laid over the horizon, requests it stretches for); REAL lays none
ASKS = {ORDINARY: (20.0, 0), SHIFT: (SHIFT_S, MIN_SIMULATED), REAL: (0.0, 0)}
KINDS = ("defaults", "candidate")


@dataclasses.dataclass
class Look:
    """One look at one run: per ask, the twin's and the measured attainment (0-1), the
    requests the twin simulated and its share of them unfinished at the horizon, and the
    (twin, measured) p90 TTFT and TPOT in ms."""

    kind: str
    repeat: int
    t: float  # seconds from the run's first arrival
    twin: dict[str, float | None]
    candidate: dict[str, float | None]  # the twin's for the candidate (in a defaults run)
    refused: dict[str, str]  # why the twin would not predict the candidate (in a defaults run)
    measured: dict[str, float | None]
    simulated: dict[str, int]
    unfinished: dict[str, float]
    ttft_p90: dict[str, tuple[float | None, float | None]]
    tpot_p90: dict[str, tuple[float | None, float | None]]


def queue_at(records: list[dict[str, Any]], t: float) -> list[QueuedRequest]:
    """The requests in the engine at `t`, in the engine's order: running, then waiting."""
    queued = []
    for r in records:
        if not r["arrival"] <= t < r["finished_t"]:
            continue
        made = produced(r, t)
        state = "running" if made else "waiting"
        queued.append(
            QueuedRequest(
                state, r["arrival"], r["prompt_len"], made, r["max_tokens"], r["priority"]
            )
        )
    return sorted(queued, key=lambda x: (x.state != "running", x.arrival))


def produced(r: dict[str, Any], t: float) -> int:
    """Output tokens of a request by `t` (before its end): the first at its TTFT, the rest
    spread evenly up to its end."""
    if r["ttft_ms"] is None or t < first_token_t(r):
        return 0
    share = (t - first_token_t(r)) / max(1e-9, r["finished_t"] - first_token_t(r))
    return min(r["output_len"] - 1, 1 + int(share * (r["output_len"] - 1)))


def first_token_t(r: dict[str, Any]) -> float:
    return float(r["arrival"] + r["ttft_ms"] / 1000)


def latencies_after(r: dict[str, Any], t: float) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) in ms as the live twin counts a request from `t`: a running one by the
    tokens it makes after `t` (the first of them at the gap between them), the rest as
    recorded."""
    made = produced(r, t)
    if not made:
        return r["ttft_ms"], request_tpot_ms(r)
    gap = 1000 * (r["finished_t"] - t) / (r["output_len"] - made)
    return gap, gap


def within(
    records: list[dict[str, Any]], t: float, horizon_s: float
) -> list[tuple[float | None, float | None]]:
    """(TTFT, TPOT) from `t` of the requests in the engine at `t` and those arriving within
    `horizon_s` after it."""
    return [
        latencies_after(r, t)
        for r in records
        if r["finished_t"] > t and r["arrival"] <= t + horizon_s and r["output_len"]
    ]


def p90(values: list[float | None]) -> float | None:
    return stats.percentile([v for v in values if v is not None], 90)


def look(
    kind: str,
    repeat: int,
    session: dict[str, Any],
    steps: list[dict[str, Any]],
    records: list[dict[str, Any]],
    args: argparse.Namespace,
) -> list[Look]:
    """Every look at one recorded run, its steps fed in time order as a live window takes
    them."""
    t0 = min(r["arrival"] for r in records)
    top_k = session["config"]["model_config"]["top_k"]
    knobs: dict[str, Any] = dict(session["knobs"])
    rows, loads = FitRows(knobs), deque[Any](maxlen=FIT_STEPS)
    fed, out = 0, []
    t_rel = args.skip
    while t_rel <= args.duration - args.horizon:
        t = t0 + t_rel
        while fed < len(steps) and steps[fed]["t"] <= t:
            knobs = knobs_after(knobs, steps[fed])
            rows.add(steps[fed])
            if (counts := routed(steps[fed])) is not None:
                loads.append(counts)
            fed += 1
        snapshot = QueueSnapshot(t, Knobs(**knobs), 0, [], queue_at(records, t))
        recent = [r for r in records if t - KEEP_S <= r["finished_t"] <= t]
        inputs = (session["config"], stacked(loads, top_k), stack(rows.rows()), recent, snapshot)
        now = Look(kind, repeat, t_rel, {}, {}, {}, {}, {}, {}, {}, {})
        for ask, (asked_s, least) in ASKS.items():
            window_s = min(asked_s, arrival_window(t_rel))  # a young server's, as the runner's
            horizon = stretched_horizon(snapshot.requests, recent, t, window_s, args.horizon, least)
            twin, _ = twin_from_live(*inputs, window_s, horizon)
            if ask == REAL:  # the records come in arrival order (storage.queries.requests)
                twin.trace += [
                    TraceItem(r["arrival"] - t, r["prompt_len"], r["output_len"], r["priority"])
                    for r in records
                    if t < r["arrival"] <= t + horizon and r["output_len"]
                ]
            trial = evaluate(twin, {}, args.slo, horizon)
            sim_out, total = trial.outcome or {}, simulated(trial)
            now.twin[ask] = trial.slo_attainment
            now.simulated[ask] = total
            now.unfinished[ask] = sim_out.get("unfinished", 0) / total if total else 0.0
            pairs = within(records, t, horizon)
            now.measured[ask] = stats.slo_attainment(pairs, args.slo)
            now.ttft_p90[ask] = (sim_out.get("ttft_p90_ms"), p90([a for a, _ in pairs]))
            now.tpot_p90[ask] = (sim_out.get("tpot_p90_ms"), p90([b for _, b in pairs]))
            if kind == "defaults":
                candidate = evaluate(twin, args.changes, args.slo, horizon)
                now.candidate[ask] = candidate.slo_attainment
                if candidate.refused:
                    now.refused[ask] = candidate.refused
        out.append(now)
        t_rel += args.every
    return out


def record(
    args: argparse.Namespace, store: Store, db: str, knobs: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Replay the load on a fresh server under `knobs`: its session, steps and requests."""
    prompt, output = parse_dist(args.prompt_len), parse_dist(args.output_len)
    trace = list(poisson_arrivals(args.rate, args.duration, prompt, output, args.seed))
    with serving(args, db, []) as client:
        if knobs:
            client.patch(
                "/api/knobs", json=knobs, params={"origin": "benchmark"}
            ).raise_for_status()
        summary = asyncio.run(run_load(str(client.base_url), trace, seed=args.seed))
        if summary["errors"]:
            raise RuntimeError(f"{summary['errors']} requests failed")
        session = wait_recorded(client, summary["ok"])
    return q.recording(store, session)


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def paired(looks: list[Look], kind: str, ask: str) -> list[tuple[float, float]]:
    """(twin, measured) of every look at a run of `kind` where both exist."""
    return [
        (x.twin[ask], x.measured[ask])  # type: ignore[misc]
        for x in looks
        if x.kind == kind and x.twin[ask] is not None and x.measured[ask] is not None
    ]


def noise_floor(looks: list[Look], kind: str, ask: str) -> float | None:
    """Mean absolute difference of the measured attainment between each two repeats of
    `kind` at the same look."""
    by_t: dict[float, list[float]] = {}
    for x in looks:
        if x.kind == kind and x.measured[ask] is not None:
            by_t.setdefault(x.t, []).append(x.measured[ask])  # type: ignore[arg-type]
    diffs = [
        abs(a - b)
        for values in by_t.values()
        for i, a in enumerate(values)
        for b in values[i + 1 :]
    ]
    return mean(diffs)


def gains(looks: list[Look], ask: str) -> list[tuple[float, float]]:
    """(predicted, measured) gain of the candidate at each look of each defaults run: the
    twin's, and the candidate runs' measured attainment less this run's (same repeat)."""
    other = {(x.repeat, x.t): x for x in looks if x.kind == "candidate"}
    out = []
    for x in looks:
        c = other.get((x.repeat, x.t))
        values = (x.twin[ask], x.candidate.get(ask), x.measured[ask], c and c.measured[ask])
        if x.kind == "defaults" and None not in values:
            twin, cand, measured, measured_c = values
            out.append((cand - twin, measured_c - measured))  # type: ignore[operator]
    return out


def means(pairs: list[tuple[float | None, float | None]]) -> str:
    """`twin / measured`, each the mean over the pairs where both exist, in ms."""
    both = [(a, b) for a, b in pairs if a is not None and b is not None]
    if not both:
        return "-"
    return (
        f"{statistics.fmean(a for a, _ in both):.0f} / {statistics.fmean(b for _, b in both):.0f}"
    )


def summarize(looks: list[Look]) -> dict[str, Any]:
    levels = {}
    for kind in KINDS:
        for ask in ASKS:
            pairs = paired(looks, kind, ask)
            chosen = [x for x in looks if x.kind == kind]
            levels[f"{kind}/{ask}"] = {
                "looks": len(pairs),
                "twin": mean([p for p, _ in pairs]),
                "measured": mean([m for _, m in pairs]),
                "bias": mean([p - m for p, m in pairs]),
                "error": mean([abs(p - m) for p, m in pairs]),
                "noise": noise_floor(looks, kind, ask),
                "simulated": mean([float(x.simulated[ask]) for x in chosen]),
                "unfinished": mean([x.unfinished[ask] for x in chosen]),
                "ttft_p90": means([x.ttft_p90[ask] for x in chosen]),
                "tpot_p90": means([x.tpot_p90[ask] for x in chosen]),
            }
    gain = {}
    for ask in ASKS:
        pairs = gains(looks, ask)
        gain[ask] = {
            "looks": len(pairs),
            "predicted": mean([p for p, _ in pairs]),
            "measured": mean([m for _, m in pairs]),
            "agree": sum((p > 0) == (m > 0) for p, m in pairs),
            # a candidate whose steps lie beyond the run's recorded ones is refused, as the
            # autopilot's looks refuse it; how often depends on what the run happened to record
            "refused": sum(ask in x.refused for x in looks if x.kind == "defaults"),
        }
    return {"levels": levels, "gains": gain}


def render(args: argparse.Namespace, argv: list[str], out: dict[str, Any], wall: float) -> str:
    lines = [
        header(
            "Live twin: its level at the autopilot's looks (`benchmarks/control/live_twin.py`)",
            ["python", "-m", "benchmarks.control.live_twin", *argv],
            wall,
            machine.measure(),
        ),
        "",
        f"- Load: {args.rate:g} req/s of `{args.prompt_len}` prompts, `{args.output_len}` "
        f"outputs, {args.duration:g} s, seed {args.seed}; `{args.model}`, {args.threads} "
        f"thread(s); targets p90 TTFT {args.ttft_ms:g} ms and TPOT {args.tpot_ms:g} ms",
        f"- Runs: defaults and candidate {args.changes}, {args.repeats} each, interleaved; a "
        f"look every {args.every:g} s from {args.skip:g} s, horizon {args.horizon:g} s",
        "- Whole runs' SLO attainment, %, each request by its own latencies (as "
        "`benchmarks/control/autopilot.py` scores a phase): "
        + "; ".join(
            f"{kind} {', '.join(pct(v) for v in values)}" for kind, values in out["whole"].items()
        ),
        "",
        "SLO attainment, %, mean over the looks; error: twin - measured, mean (mean absolute); "
        "noise floor: |run - run| of the measured at the same look, mean; unfinished: the "
        "twin's requests still running or waiting at the horizon (`tuning.twin.outcome.judged`); "
        "p90s: twin / measured, ms, mean over the looks (the twin's of the requests that "
        "ended within its horizon):",
        "",
        "| runs | asked | looks | requests | twin | measured | error | noise floor | "
        "unfinished | p90 TTFT | p90 TPOT |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, v in out["summary"]["levels"].items():
        kind, ask = name.split("/")
        lines.append(
            f"| {kind} | {ask} | {v['looks']} | {v['simulated'] or 0:.0f} | {pct(v['twin'])} "
            f"| {pct(v['measured'])} | {pct(v['bias'], True)} ({pct(v['error'])}) | "
            f"{pct(v['noise'])} | {pct(v['unfinished'])} | {v['ttft_p90']} | {v['tpot_p90']} |"
        )
    lines += [
        "",
        "The candidate's gain over the defaults, points, mean over the looks at the defaults' "
        "runs: the twin's there, and measured (the candidate's run at the same look less the "
        "defaults'):",
        "",
        "| asked | looks | predicted | measured | same sign | refused |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for ask, v in out["summary"]["gains"].items():
        lines.append(
            f"| {ask} | {v['looks']} | {pct(v['predicted'], True)} | "
            f"{pct(v['measured'], True)} | {v['agree']} of {v['looks']} | {v['refused']} |"
        )
    return "\n".join(lines)


def parse_changes(text: str) -> dict[str, int]:
    """`max_num_batched_tokens=1024,prefill_chunk_size=256` as a knob change."""
    pairs = (part.split("=", 1) for part in text.split(",") if part)
    return {name.strip(): int(value) for name, value in pairs}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic:small")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rate", type=float, default=1.5)
    p.add_argument("--duration", type=float, default=75.0)
    p.add_argument("--prompt-len", default="uniform:1024:1800")
    p.add_argument("--output-len", default="uniform:16:96")
    p.add_argument("--ttft-ms", type=float, default=1000.0)
    p.add_argument("--tpot-ms", type=float, default=60.0)
    p.add_argument("--candidate", default="max_num_batched_tokens=1024,prefill_chunk_size=256")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--every", type=float, default=2.5, help="seconds between looks")
    p.add_argument("--skip", type=float, default=15.0, help="seconds before the first look")
    p.add_argument("--horizon", type=float, default=10.0, help="the autopilot's horizon_s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="synthetic:tiny, a 12 s load")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.duration, args.rate, args.skip = "synthetic:tiny", 12.0, 3.0, 4.0
        args.prompt_len, args.output_len, args.every, args.horizon = (
            "uniform:256:512",
            "uniform:4:32",
            2.0,
            4.0,
        )
    args.changes = parse_changes(args.candidate)
    args.slo = stats.SLO(ttft=args.ttft_ms, tpot=args.tpot_ms)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.perf_counter()
    looks: list[Look] = []
    whole: dict[str, list[float | None]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{Path(tmp) / 'live_twin.db'}"
        store = Store(db)
        try:
            for repeat in range(args.repeats):
                kinds = KINDS if repeat % 2 == 0 else KINDS[::-1]
                for kind in kinds:
                    knobs = args.changes if kind == "candidate" else {}
                    session, steps, records = record(args, store, db, knobs)
                    looks += look(kind, repeat, session, steps, records, args)
                    whole[kind].append(Measured.of(records, args.slo).attainment)
                    print(f"{kind} run {repeat + 1} looked at", file=sys.stderr, flush=True)
        finally:
            store.close()
    looks_out = [dataclasses.asdict(x) for x in looks]
    out = {"looks": looks_out, "whole": whole, "summary": summarize(looks)}
    publish(SECTION, render(args, argv, out, time.perf_counter() - started), results_path(args))
    return out


if __name__ == "__main__":
    main()
