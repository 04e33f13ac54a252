"""Smoke test: the step-loop benchmark runs end to end in its quick mode and writes its section."""

from pathlib import Path

from benchmarks.harness.results_md import markers
from benchmarks.speed import step_loop


def test_step_loop_quick(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    out = step_loop.main(["--quick", "--results", str(results)])
    assert set(out["runs"]) == {4, 16}
    for arms in out["runs"].values():
        assert set(arms) == {*step_loop.ARMS, step_loop.MATCHED, step_loop.OVERLAP}
        for arm, steps in arms.items():
            assert len(steps.wall_s) == len(steps.forward_s) == (4 if arm == "long prompt" else 12)
            # with overlap a step's forward pass starts before the call that returns it
            most = float("inf") if arm == step_loop.OVERLAP else 1.0
            assert all(0 < f < w * most for f, w in zip(steps.forward_s, steps.wall_s, strict=True))
            assert steps.output_len == sorted(steps.output_len)  # every step added a token
    early, late = out["windows"]["early"], out["windows"]["late"]
    assert late[16, "A"].output_len > early[16, "A"].output_len
    assert late[16, "A"].output_len > late[16, "long prompt"].output_len
    assert (16, "long prompt") not in early and early[16, "A"].host_us_per_request > 0
    for key, check in out["targets"].items():
        assert check["met"] == step_loop.TARGETS[key].met(check["value"])
    begin, end = markers(step_loop.SECTION)
    text = results.read_text()
    assert text.count(begin) == text.count(end) == 1 and "| 16 | A/A |" in text
