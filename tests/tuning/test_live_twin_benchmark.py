"""benchmarks/control/live_twin.py rebuilds a live engine's queue from its records and runs end
to end on the tiny model."""

from pathlib import Path
from typing import Any

import pytest

import stats
from benchmarks.control import live_twin as bench
from benchmarks.harness.results_md import markers


def record(arrival: float, ttft_ms: float, finished_t: float, output_len: int) -> dict[str, Any]:
    e2e_ms = 1000 * (finished_t - arrival)
    return {
        "arrival": arrival,
        "ttft_ms": ttft_ms,
        "finished_t": finished_t,
        "e2e_ms": e2e_ms,
        "prompt_len": 100,
        "output_len": output_len,
        "max_tokens": output_len,
        "priority": 0,
    }


def test_the_queue_at_a_moment_is_rebuilt_from_the_records() -> None:
    """At 2 s: the first request (first token at 1 s, ends at 3 s, 5 tokens) made 3 tokens
    and runs; the second (first token at 2.3 s) waits; the third had ended."""
    records = [record(0.0, 1000, 3.0, 5), record(1.5, 800, 4.0, 3), record(0.2, 100, 1.0, 4)]
    running, waiting = bench.queue_at(records, 2.0)
    assert (running.state, running.generated, running.arrival) == ("running", 3, 0.0)
    assert (waiting.state, waiting.generated, waiting.arrival) == ("waiting", 0, 1.5)
    # the running one counts from 2 s: its 2 tokens to come took the 1 s left, 500 ms each
    assert bench.latencies_after(records[0], 2.0) == (500.0, 500.0)
    assert bench.latencies_after(records[1], 2.0) == (800.0, pytest.approx(850.0))
    slo = stats.SLO(ttft=900, tpot=600)

    def measured(t: float, horizon_s: float) -> tuple[float | None, int]:
        pairs = bench.within(records, t, horizon_s)
        return stats.slo_attainment(pairs, slo), len(pairs)

    assert measured(2.0, 10.0) == (0.5, 2)
    # at 0.5 s the first misses by its 1 s TTFT; the third runs on at 167 ms a token
    assert measured(0.5, 0.5) == (0.5, 2)


@pytest.mark.slow  # four real servers run a 12 s load
def test_quick_run_tables_every_ask_against_the_measured(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    out = bench.main(["--quick", "--results", str(results)])
    levels = out["summary"]["levels"]
    assert set(levels) == {f"{k}/{a}" for k in bench.KINDS for a in bench.ASKS}
    for v in levels.values():
        assert v["looks"] >= 3 and 0 <= v["twin"] <= 1 and 0 <= v["measured"] <= 1
        assert v["noise"] is not None and v["simulated"] > 0
        assert all(len(v[p90].split(" / ")) == 2 for p90 in ("ttft_p90", "tpot_p90"))
    # each ask's gain is either compared or refused (the run's steps decide which), never lost
    refusals = [r for x in out["looks"] for r in x["refused"].values()]
    assert all(r.startswith("not enough steps like this") for r in refusals)
    assert all(g["looks"] + g["refused"] >= 1 for g in out["summary"]["gains"].values())
    assert all(len(v) == 2 and all(0 <= x <= 1 for x in v) for v in out["whole"].values())
    text = results.read_text()
    assert all(text.count(m) == 1 for m in markers(bench.SECTION))
    assert all(f"| {ask} |" in text for ask in bench.ASKS)
    assert "| unfinished | p90 TTFT | p90 TPOT |" in text
