"""benchmarks/control/soak.py runs end to end: side traffic answered right, memory sampled."""

from pathlib import Path

import pytest

from benchmarks.control import soak as bench
from benchmarks.harness.results_md import markers


def test_growth_is_read_after_the_warm_up() -> None:
    samples = [bench.Sample(t, 0, 300.0 + t, 100.0) for t in (0.0, 10.0, 20.0, 30.0)]
    assert bench.growth(samples, 10.0) == 20.0
    assert bench.growth(samples[:1], 10.0) != bench.growth(samples[:1], 10.0)  # NaN: too few


@pytest.mark.slow
def test_short_soak_answers_every_side_request(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    args = ["--duration-s", "12", "--warmup-s", "4", "--sample-s", "2", "--change-s", "0.5"]
    out = bench.main([*args, "--rate", "5", "--results", str(results)])
    counts = out["counts"]
    assert counts.wrong == []
    assert counts.changes >= 5 and counts.bad_inputs >= 3 and counts.websockets >= 1
    assert counts.hangups >= 3
    assert len(out["samples"]) >= 4 and all(s.server_mb > 0 for s in out["samples"])
    assert out["status"]["kv"]["used"] == 0  # no block left in use once the load has stopped
    sizes = out["status"]["sizes"]
    assert sizes and all(s["size"] <= s["limit"] for s in sizes.values())
    text = results.read_text()
    assert all(text.count(m) == 1 for m in markers(bench.SECTION))
    assert text.count("[met]") + text.count("[MISSED]") == 1
