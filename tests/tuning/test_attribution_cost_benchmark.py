"""benchmarks/control/attribution_cost.py measures something real and leaves the engine as it
was."""

from pathlib import Path

from benchmarks.control import attribution_cost as bench
from benchmarks.harness.results_md import markers
from engine.scheduler import Scheduler
from engine.step_telemetry import SchedInfo


def test_quick_run_blocks_admission_and_stores_sched(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    out = bench.main(["--quick", "--results", str(results)])
    assert out["blocked_share"] == 1.0  # the queue is kept full: every step left some waiting
    assert out["bytes_on"] > out["bytes_off"] > 0
    assert out["steps"] == 6
    begin, end = markers(bench.SECTION)
    text = results.read_text()
    assert begin in text and end in text and "Step time on / off" in text


def test_attribution_off_is_undone() -> None:
    with bench.attribution(on=False):
        assert SchedInfo is not bench.engine.step_telemetry.SchedInfo
    with bench.attribution(on=True):
        assert SchedInfo is bench.engine.step_telemetry.SchedInfo
    assert bench.engine.step_telemetry.SchedInfo is SchedInfo
    assert Scheduler._blocked.__name__ == "_blocked"
    assert isinstance(Scheduler.__dict__["_ahead"], staticmethod)
