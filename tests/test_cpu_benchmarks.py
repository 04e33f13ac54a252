"""Smoke tests: the forward and thread-count benchmarks run end to end in their quick modes."""

from pathlib import Path

import forward  # benchmarks/ is on pytest's pythonpath
import pytest
import threads
from results_md import markers


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
