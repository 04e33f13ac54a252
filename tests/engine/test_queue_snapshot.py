"""The engine's queue snapshot, read by the what-if twin and the autopilot."""

from engine import LLMEngine, SamplingParams
from engine.queue_snapshot import queue_snapshot


def test_a_snapshot_tells_started_requests_from_waiting_ones() -> None:
    """One slot: after a step the first request has its first token, the second waits."""
    engine = LLMEngine(model="synthetic:tiny", num_kv_blocks=64, block_size=4, max_num_seqs=1)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request([1, 2, 3], params, arrival=10.0)
    engine.add_request([4, 5, 6], params, arrival=11.0)
    assert queue_snapshot(engine).arrivals(started=False) == [10.0, 11.0]
    engine.step()
    snapshot = queue_snapshot(engine)
    assert snapshot.arrivals(started=True) == [10.0]
    assert snapshot.arrivals(started=False) == [11.0]
