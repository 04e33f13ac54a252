"""A sample attribution report in the server's shape (GET /api/attribution), for the
"Why slow?" tests."""

from typing import Any

T = 1_700_000_000.0  # unix seconds of the first bucket's start
CAUSES = {
    "queue_slots": "queueing for a slot: max_num_seqs",
    "queue_busy": "arriving while a step ran",
    "prefill": "its own prefill",
    "preemption": "preemption: stalled, or recomputing lost KV",
    "overhead": "engine work between steps",
    "decode": "decode steps",
    "decode_tax": "prefill chunks riding in its decode steps",
}


def _phase(t0: float, t1: float, phase: str, cause: str | None = None) -> dict[str, Any]:
    return {"t0": T + t0, "t1": T + t1, "phase": phase, "cause": cause}


def timelines() -> list[dict[str, Any]]:
    """`slow` queued for a slot; `early` arrived first and was preempted once."""
    slow = {
        "req": "slow",
        "arrival": T + 1.0,
        "end": T + 2.0,
        "ttft_ms": 112.0,
        "e2e_ms": 1000.0,
        "output_len": 11,
        "ttft": {"queue_slots": 80.0, "prefill": 30.0, "overhead": 2.0},
        "tpot": {"decode": 80.0, "decode_tax": 8.8},
        "after_first_token": {"decode": 800.0, "decode_tax": 88.0},
        "steps": [3, 40],
        "phases": [
            _phase(1.0, 1.08, "waiting", "queue_slots"),
            _phase(1.08, 1.112, "prefill"),
            _phase(1.112, 2.0, "decode"),
        ],
    }
    early = {
        "req": "early",
        "arrival": T + 0.5,
        "end": T + 3.0,
        "ttft_ms": 40.0,
        "e2e_ms": 2500.0,
        "output_len": 6,
        "ttft": {"queue_busy": 5.0, "prefill": 35.0},
        "tpot": {"decode": 300.0, "preemption": 192.0},
        "after_first_token": {"decode": 1500.0, "preemption": 960.0},
        "steps": [1, 60],
        "phases": [
            _phase(0.5, 0.505, "waiting", "queue_busy"),
            _phase(0.505, 0.54, "prefill"),
            _phase(0.54, 1.5, "decode"),
            _phase(1.5, 2.46, "preempted", "preemption"),
            _phase(2.46, 3.0, "decode"),
        ],
    }
    return [slow, early]


def report() -> dict[str, Any]:
    """Two 5 s buckets (one with a cause the dashboard has no colour for) and two requests."""
    return {
        "requests": 3,
        "ttft": {"queue_slots": 0.55, "prefill": 0.4, "overhead": 0.05},
        "tpot": {"decode": 0.8, "decode_tax": 0.2},
        "ttft_p90": {"queue_slots": 0.62, "prefill": 0.38},
        "tpot_p90": {"decode": 0.9, "decode_tax": 0.1},
        "dominant": {
            "ttft": {
                "cause": "queue_slots",
                "share": 0.62,
                "text": "62% of p90 TTFT is queueing for a slot: max_num_seqs",
            },
            "tpot": {"cause": "decode", "share": 0.9, "text": "90% of p90 TPOT is decode steps"},
        },
        "causes": CAUSES,
        "over_time": [
            {
                "t0": T,
                "t1": T + 5.0,
                "requests": 2,
                "ttft": {"queue_slots": 80.0, "prefill": 30.0, "overhead": 2.0},
                "tpot": {"decode": 10.0, "decode_tax": 2.5},
            },
            {
                "t0": T + 5.0,
                "t1": T + 10.0,
                "requests": 1,
                "ttft": {"prefill": 25.0, "mystery": 4.0},
                "tpot": {"decode": 9.0},
            },
        ],
        "recent": timelines(),
        "from": T - 50.0,
        "to": T + 10.0,
    }
