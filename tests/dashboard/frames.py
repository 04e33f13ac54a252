"""Synthetic StepTelemetry frames for the chart tests."""

import random
from pathlib import Path
from typing import Any

from engine.bus import TelemetryBus
from engine.telemetry import StepTelemetry
from storage import Recorder, Store
from storage import queries as q


def frame(step: int, changes: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """Step `step` of a 4-slot batch: slot 0 prefills, slots 1-2 decode; 2 layers x 4 experts;
    2 expert-parallel ranks (modeled)."""
    return {
        "v": 1,
        "session": "s",
        "step": step,
        "t": 1000.0 + step * 0.01,
        "knobs_version": 1,
        "dur_ms": {
            "schedule": 0.1,
            "prepare": 0.2,
            "forward": 2.0,
            "moe": 1.0,
            "sample": 0.1,
            "total": 2.4,
        },
        "batch": {
            "max_slots": 4,
            "token_budget": 64,
            "num_prefill_tokens": 16,
            "num_decode_tokens": 2,
            "slots": [
                {"slot": 0, "req": f"p{step}", "phase": "prefill", "tokens": 16, "ctx": 16},
                {"slot": 1, "req": "a", "phase": "decode", "tokens": 1, "ctx": 20},
                {"slot": 2, "req": "b", "phase": "decode", "tokens": 1, "ctx": 9},
            ],
        },
        "queue": {
            "waiting": 2,
            "running": 3,
            "swapped": 0,
            "arrived": 1,
            "finished": 1,
            "preempted": step % 5 == 0,
        },
        "kv": {
            "block_size": 16,
            "total": 64,
            "usable": 60,
            "used": 10,
            "cached": 5,
            "free": 45,
            "tokens": 140,
            "watermark_blocks": 6,
            "host_total": 0,
            "host_used": 0,
            "prefix_hit_rate": 0.0,
        },
        "experts": {
            "layers": 2,
            "experts": 4,
            "top_k": 2,
            "counts": [[6, 2, 2, 2], [3, 3, 3, 3]],
            "dropped": [0, 0],
            "balance": [0.5, 1.0],
        },
        "a2a": {
            "ep_size": 2,
            "mode": "modeled",
            "bytes": [[0, 128], [256, 0]],
            "gather_bytes": [[0, 64], [64, 0]],
            "rank_tokens": [10, 6],
            "rank_moe_ms": [],
            "imbalance": 1.25,
            "placement_version": 1,
        },
        "latency": {"ttft_ms": [float(step)], "tpot_ms": [1.0]},
        "knob_changes": [{"version": 2, "t": 0.0, "origin": "dashboard", "changes": changes}]
        if changes
        else [],
    }


# the autopilot's reasons, as long as its own (tuning.autopilot.pilot.change_reason), and a few that
# test the hover text's wrapping: runs of blanks and line breaks, a word longer than a line,
# characters outside the BMP (Python counts them once, JavaScript's length twice), lines of
# just 80 and 81 characters, only blanks
REASONS = (
    "p90 TTFT 1.9 s > 800 ms target (70% of p90 TTFT is queueing for a slot: max_num_seqs): "
    "max_num_seqs 16 → 32; predicted p90 TTFT 1.9 s → 600 ms, p90 TPOT 40 ms → 45 ms, "
    "queued at the horizon 12 → 0, attainment 40% → 85%",
    "rolled back:  SLO attainment 61% of 40 requests\nafter the change, 80% before: "
    + "x" * 90
    + " next change no sooner than 60 s",
    "🚀" * 50 + " " + "🚀🚀 " * 30,
    " ".join(c * n for c, n in (("c", 39), ("d", 40), ("a", 40), ("b", 40))),  # 80, 81 wide
    "   ",
)


def autopilot_change(version: int, changes: dict[str, list[Any]], reason: str) -> dict[str, Any]:
    """A KnobChange's dict as the autopilot makes it."""
    return {
        "version": version,
        "t": 0.0,
        "origin": "autopilot",
        "changes": changes,
        "reason": reason,
    }


def frames(n: int = 30, change_at: int = 10) -> list[dict[str, Any]]:
    return [frame(i, {"max_num_seqs": [8, 4]} if i == change_at else None) for i in range(n)]


def old_frame(step: int) -> dict[str, Any]:
    """A frame as recorded before the per-rank all-to-all fields and the KV watermark."""
    f = frame(step)
    f["a2a"] = {k: f["a2a"][k] for k in ("ep_size", "mode", "bytes")}
    del f["kv"]["watermark_blocks"]
    return f


def varied_frame(rng: random.Random, step: int, t: float) -> dict[str, Any]:
    """Step `step` at time `t` with numbers drawn from `rng`: latencies (none to three
    requests), batch, KV, stage times, expert loads (some dropped), measured or modeled
    all-to-all, and now and then a knob change."""
    f = frame(step, {"max_num_seqs": [8, rng.randint(1, 8)]} if rng.random() < 0.1 else None)
    f["t"] = t
    f["latency"] = {
        "ttft_ms": [rng.uniform(0, 500) for _ in range(rng.randint(0, 3))],
        "tpot_ms": [rng.choice([1.0, 2.5, rng.uniform(0, 40)]) for _ in range(rng.randint(0, 3))],
    }
    slots = rng.sample(range(4), rng.randint(0, 4))
    f["batch"]["slots"] = [
        {
            "slot": s,
            "req": f"r{rng.randint(0, 12)}",
            "phase": rng.choice(["prefill", "decode"]),
            "tokens": rng.randint(1, 16),
            "ctx": rng.randint(1, 90),
        }
        for s in slots
    ]
    f["batch"]["num_prefill_tokens"] = rng.randint(0, 48)
    f["batch"]["num_decode_tokens"] = rng.randint(0, 4)
    f["dur_ms"] = {k: rng.uniform(0, 5) for k in f["dur_ms"]}
    f["kv"].update(used=rng.randint(0, 50), cached=rng.randint(0, 10), free=rng.randint(0, 50))
    f["queue"].update(waiting=rng.randint(0, 9), preempted=rng.randint(0, 2))
    f["experts"]["counts"] = [[rng.randint(0, 9) for _ in range(4)] for _ in range(2)]
    f["experts"]["dropped"] = [rng.choice([0, 0, 3]), 0]
    f["a2a"]["mode"] = rng.choice(["measured", "modeled"])
    f["a2a"]["bytes"] = [[rng.randint(0, 999) for _ in range(2)] for _ in range(2)]
    f["a2a"]["imbalance"] = rng.uniform(1, 2)
    if f["knob_changes"] and step % 3:  # the rest a person's, without a reason
        (change,) = f["knob_changes"]
        f["knob_changes"] = [autopilot_change(3, change["changes"], REASONS[step % len(REASONS)])]
    return f


def varied_frames(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` varied frames, 1 to 30 ms apart (some at the same time)."""
    rng = random.Random(seed)
    t = 1000.0
    out = []
    for step in range(n):
        t += rng.choice([0.0, rng.uniform(0.001, 0.03)])
        out.append(varied_frame(rng, step, t))
    return out


def recorded(frames: list[dict[str, Any]], tmp: Path) -> tuple[list[dict[str, Any]], list[Any]]:
    """`frames` through the recorder into a fresh SQLite database and back: the steps as the
    Compare and replay pages get them, and the knob changes as their table holds them."""
    store = Store(f"sqlite:///{tmp / 'recorded.db'}")
    steps, requests = TelemetryBus(), TelemetryBus()
    rec = Recorder(store, steps, requests)
    rec.start("main", model="synthetic:test", engine_session="s", config={}, knobs={})
    for f in frames:
        steps.publish(StepTelemetry.model_validate(f).model_dump())
    assert rec.flush()
    rec.close()
    try:
        return q.steps(store, "main"), q.knob_changes(store, "main")
    finally:
        store.close()
