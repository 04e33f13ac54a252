"""stats: one percentile, summary, TPOT, SLO attainment and goodput, and every consumer agrees."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from cli.loadgen import Result
from cli.loadgen import summarize as load_summary
from cli.main import summarize as offline_summary
from dashboard import compare
from engine.outputs import RequestOutput
from stats import (
    QUANTILES,
    SLO,
    goodput,
    percentile,
    ranked_percentile,
    slo_attainment,
    summary,
    tpot,
    tpot_span,
)
from storage import Store, queries
from storage.models import RequestRow, SessionRow

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=1, max_size=60), st.floats(min_value=0, max_value=100))
def test_percentile_equals_numpy_linear(values: list[float], q: float) -> None:
    assert percentile(values, q) == float(np.percentile(values, q, method="linear"))
    assert ranked_percentile(sorted(values), q) == percentile(values, q)


def test_percentile_edges() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # the mean of the middle two
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0 and percentile([4.0, 1.0], 100) == 4.0
    assert percentile(map(float, range(11)), 99) == pytest.approx(9.9)  # not nearest-rank 10
    for q in (-1, 100.5):
        with pytest.raises(ValueError, match="0..100"):
            percentile([1.0], q)


def test_summary_matches_numpy_and_defines_the_empty_case() -> None:
    values = [12.0, 7.5, 30.25, 18.0, 9.0, 41.5, 15.0, 22.75, 11.0, 60.0, 8.25]
    s = summary(iter(values))
    assert s["count"] == 11 and s["mean"] == pytest.approx(np.mean(values))
    for q in QUANTILES:
        assert s[f"p{q}"] == np.percentile(values, q)
    assert summary([]) == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}


def test_tpot_is_the_mean_gap_after_the_first_token() -> None:
    assert tpot([10.0, 11.0, 13.0]) == 1.5  # TTFT (10) is not part of it
    assert tpot([10.0]) is None and tpot([]) is None
    assert tpot_span(100.0, 600.0, 11) == 50.0
    assert tpot_span(100.0, 100.0, 1) is None


def test_slo_attainment_and_goodput() -> None:
    slo = SLO(ttft=100.0, tpot=10.0)
    assert slo.met(100.0, 10.0)  # bounds are inclusive
    assert not slo.met(100.5, 1.0) and not slo.met(1.0, 10.5)
    assert slo.met(50.0, None)  # one output token: TTFT alone
    assert not slo.met(None, None)  # failed before its first token
    requests = [(50.0, 5.0), (150.0, 5.0), (50.0, 20.0), (None, None), (80.0, None)]
    assert slo_attainment(requests, slo) == 2 / 5
    assert goodput(requests, slo, duration_s=4.0) == 0.5
    assert slo_attainment([], slo) is None
    assert goodput([], slo, duration_s=4.0) == 0.0
    assert goodput(requests, slo, duration_s=0.0) is None


def test_stats_imports_nothing_from_the_project() -> None:
    """So that the dashboard (which must not import engine or storage) may use it."""
    project = ("engine", "kernels", "api", "server", "cli", "storage", "dashboard", "tuning")
    code = f"import sys, stats; print([m for m in sys.modules if m.split('.')[0] in {project}])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


LATENCIES_MS = [12.0, 7.5, 30.25, 18.0, 9.0, 41.5, 15.0, 22.75, 11.0, 60.0, 8.25, 26.5]
TPOTS_MS = [2.5, 3.0, 1.75, 4.0, 2.25, 6.5, 3.5, 2.0, 5.4, 1.5, 2.7, 3.3]


def _close(got: float | None, want: float | None) -> bool:
    """Equal to the microsecond: consumers may round to 3 decimals of a millisecond."""
    return got is not None and want is not None and abs(got - want) <= 5e-4 + 1e-9


def _sessions_ttft(path: Path) -> dict[str, float | None]:
    """The sessions API's request stats of one session recorded in a SQLite file."""
    store = Store(f"sqlite:///{path}")
    with Session(store.engine) as conn:
        conn.add(
            SessionRow(
                id="s",
                kind="server",
                model="m",
                engine_session="e",
                config={},
                knobs={},
                knobs_version=1,
                started_t=0.0,
            )
        )
        conn.flush()  # the session row first: the requests refer to it
        conn.add_all(
            RequestRow(
                session_id="s",
                req=f"r{i}",
                arrival=float(i),
                finished_t=float(i) + 1,
                prompt_len=4,
                output_len=11,
                max_tokens=11,
                ttft_ms=ms,
                e2e_ms=ms + 10 * TPOTS_MS[i],
                finish_reason="length",
                preemptions=0,
            )
            for i, ms in enumerate(LATENCIES_MS)
        )
        conn.commit()
    stats = queries.get_session(store, "s")["request_stats"]
    store.close()
    return {f"p{p}": stats[f"ttft_ms_p{p}"] for p in QUANTILES}


def _offline_rows() -> dict[str, list[str]]:
    """The numbers after p50, p90 and p99 on `moescope generate`'s TTFT and TPOT lines."""
    outputs = [
        RequestOutput(
            request_id=f"r{i}",
            prompt_token_ids=[1],
            token_ids=[1, 2],
            text="",
            finished=True,
            finish_reason="length",
            ttft_s=ms / 1000,
            token_times_s=[ms / 1000, (ms + TPOTS_MS[i]) / 1000],
        )
        for i, ms in enumerate(LATENCIES_MS)
    ]
    rows = {}
    for line in offline_summary(outputs, wall_s=1.0).splitlines():
        name, _, rest = line.partition(" ms ")
        if name in ("TTFT", "TPOT"):
            rows[name] = rest.split()[1::2]
    return rows


def test_every_consumer_reports_the_same_percentiles(tmp_path: Path) -> None:
    ttft, tp = summary(LATENCIES_MS), summary(TPOTS_MS)

    load = load_summary(
        [
            Result(True, None, ms / 1000, t / 1000, 2 * ms / 1000, 4, 11)
            for ms, t in zip(LATENCIES_MS, TPOTS_MS, strict=True)
        ],
        wall_s=1.0,
        model="m",
    )
    for p in ("p50", "p90", "p99"):
        assert _close(load["ttft_ms"][p], ttft[p]) and _close(load["tpot_ms"][p], tp[p])

    requests = [
        {
            "arrival": float(i),
            "finished_t": float(i) + 1,
            "prompt_len": 4,
            "output_len": 11,
            "ttft_ms": ms,
            "e2e_ms": ms + 10 * TPOTS_MS[i],
        }
        for i, ms in enumerate(LATENCIES_MS)
    ]
    cmp = compare.summarize({"id": "a"}, [], requests)
    assert (cmp["ttft_p50_ms"], cmp["ttft_p99_ms"]) == (ttft["p50"], ttft["p99"])
    assert _close(cmp["tpot_p50_ms"], tp["p50"]) and _close(cmp["tpot_p99_ms"], tp["p99"])

    sessions = _sessions_ttft(tmp_path / "moescope.db")
    assert all(_close(sessions[p], ttft[p]) for p in ("p50", "p90", "p99"))

    offline = _offline_rows()
    assert offline["TTFT"] == [f"{ttft[p]:.1f}" for p in ("p50", "p90", "p99")]
    assert offline["TPOT"] == [f"{tp[p]:.2f}" for p in ("p50", "p90", "p99")]
