"""Smoke tests: the forward, thread-count, decode-step, GIL and serve-overhead benchmarks run
end to end in their quick modes, and the peer benchmark's offline arm on a tiny checkpoint."""

from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.harness.results_md import markers
from benchmarks.peer import decode_steps, serve_overhead
from benchmarks.peer import offline as peer_offline
from benchmarks.peer.runs import OUTPUT_RANGE, PROMPT_RANGE, REPO
from benchmarks.speed import forward, gil, threads
from benchmarks.speed.offline_runners import QUICK_SHAPE, build_checkpoint, make_workload


def _published(path: Path, section: str) -> str:
    begin, end = markers(section)
    text = path.read_text()
    assert text.count(begin) == text.count(end) == 1
    return text


@pytest.mark.slow
def test_forward_quick(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    out = forward.main(["--quick", "--results", str(results)])
    (result,) = out["results"].values()
    assert set(result["arms"]) == set(forward.ARMS)
    for runs in result["arms"].values():
        (arm,) = runs
        assert arm.prefill_tokens > 0 and 0 < arm.prefill_s <= arm.forward_s
        assert arm.full_decode_s and arm.decode_tok_s(result["batch"]) > 0
    for key, check in out["targets"].items():
        assert check["met"] == forward.TARGETS[key].met(check["value"])
    assert "| bf16 |" in _published(results, forward.SECTION)


@pytest.mark.slow
def test_threads_quick(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    out = threads.main(["--quick", "--results", str(results)])
    conditions = {(c, str(t)) for c in ("quiet", "busy") for t in threads.ARMS}
    assert set(out["runs"]) == conditions
    assert all(len(v) == 1 and v[0] > 0 for v in out["runs"].values())
    assert set(out["targets"]) == set(threads.TARGETS)
    assert "| busy | auto |" in _published(results, threads.SECTION)


PEER_SHAPE = replace(QUICK_SHAPE, max_positions=1024)  # room for the peer workload's requests


@pytest.mark.parametrize("via", ["steps", "loop"])
def test_peer_offline_arm_runs_the_whole_workload(tmp_path: Path, via: str) -> None:
    model = build_checkpoint(tmp_path / "model", PEER_SHAPE, 0)
    out = peer_offline.main([str(model), "--requests", "3", "--threads", "1", "--via", via])
    wl = make_workload(3, 0, PEER_SHAPE.vocab, PROMPT_RANGE, OUTPUT_RANGE)
    assert out["tokens"] == sum(wl.max_tokens)
    assert out["steps"] > 0 and 0 < out["busy_s"] <= out["wall_s"]


@pytest.mark.slow
def test_serve_overhead_quick(tmp_path: Path) -> None:
    model = build_checkpoint(tmp_path / "model", PEER_SHAPE, 0)
    results = tmp_path / "RESULTS.md"
    argv = ["--quick", "--model", str(model), "--threads", "1", "--results", str(results)]
    out = serve_overhead.main(argv)
    wl = make_workload(16, 0, PEER_SHAPE.vocab, PROMPT_RANGE, OUTPUT_RANGE)
    assert [r.engine for r in out["runs"]] == list(serve_overhead.ARMS)
    assert all(r.tokens == wl.num_output_tokens and r.extra["steps"] > 0 for r in out["runs"])
    s = out["summary"]
    assert s["serve_offline"] == pytest.approx(s["serve"] / s["offline"])
    assert "| 1 | loop |" in _published(results, "serve_overhead_serve_bf16_t1")


@pytest.mark.slow
def test_serve_overhead_before_and_overlap_quick(tmp_path: Path) -> None:
    """--before runs a checkout's own offline.py and `moescope serve` (here this one, from
    its own directory), --overlap adds both arms with overlapped steps."""
    model = build_checkpoint(tmp_path / "model", PEER_SHAPE, 0)
    results = tmp_path / "RESULTS.md"
    argv = ["--quick", "--model", str(model), "--threads", "1", "--results", str(results)]
    out = serve_overhead.main([*argv, "--before", str(REPO), "--overlap"])
    arms = serve_overhead.BEFORE_ARMS + serve_overhead.OVERLAP_ARMS
    assert [r.engine for r in out["runs"]] == list(arms)
    wl = make_workload(16, 0, PEER_SHAPE.vocab, PROMPT_RANGE, OUTPUT_RANGE)
    assert all(r.tokens == wl.num_output_tokens and r.extra["steps"] > 0 for r in out["runs"])
    s = out["summary"]
    assert s["serve_before"] == pytest.approx(s["serve"] / s["before serve"])
    assert s["overlap_offline"] == pytest.approx(s["offline overlap"] / s["offline"])
    text = _published(results, "serve_overhead_serve_bf16_t1")
    assert "| 1 | before serve |" in text and "this checkout / --before's" in text


@pytest.mark.slow
def test_decode_steps_quick(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    out = decode_steps.main(["--quick", "--results", str(results)])
    assert set(out["ours"]) == set(decode_steps.PRECISIONS)
    assert all(set(ms) == {1, 4} and min(ms.values()) > 0 for ms in out["ours"].values())
    run = out["workload"]
    assert sum(n == 6 for _, n, _ in run["steps"]) >= 1  # all six requests ran together
    assert "| 1-4 |" in _published(results, decode_steps.SECTION)


def test_batched_bench_rows_parse() -> None:
    text = """
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |     64 |    1 |    192 |    0.051 |  2509.80 |    0.384 |   166.67 |    0.435 |   441.38 |
|   128 |     64 |   32 |   6144 |    1.612 |  2540.94 |    1.472 |  1391.30 |    3.084 |  1992.22 |
"""
    assert decode_steps.parse_batched_bench(text, 64) == pytest.approx({1: 6.0, 32: 23.0})


@pytest.mark.slow
def test_gil_quick(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    out = gil.main(["--quick", "--results", str(results)])
    assert set(out) == set(gil.ARMS)
    assert all(len(ms) == 1 and ms[0] > 0 for ms in out.values())
    assert "| busy Python in a child process (nice 10) |" in _published(results, gil.SECTION)
