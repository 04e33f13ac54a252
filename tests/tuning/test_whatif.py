"""A recorded session's twin refuses a KV capacity its own requests could never fit in, as the
engine refuses one below a live request's need."""

from dataclasses import asdict
from typing import Any

import pytest
from test_cost_model import fake_session

from engine.config import CacheConfig
from engine.errors import InvalidInput
from engine.knobs import Knobs
from tuning.twin.trace import TraceItem, blocks_needed
from tuning.twin.tune import knob_values
from tuning.twin.whatif import twin_from_recording

CONFIG = {
    "model_config": {"num_layers": 4, "num_experts": 8, "hidden_size": 64, "max_model_len": 1024},
    "engine_config": {
        "cache": asdict(CacheConfig(block_size=16, num_blocks=256)),
        "parallel": {"ep_size": 1},
        "dtype": "float32",
        "batching": "continuous",
    },
}


def records() -> list[dict[str, Any]]:
    """Three requests; the largest holds 100 + 60 tokens = 10 blocks of 16 by its end."""
    lengths = [(20, 5), (100, 60), (40, 8)]
    return [
        {"arrival": 100.0 + i, "prompt_len": p, "output_len": n, "finished_t": 101.0 + i}
        for i, (p, n) in enumerate(lengths)
    ]


def test_blocks_needed_is_the_largest_requests_need_capped_by_the_context() -> None:
    items = [TraceItem(0.0, 100, 60), TraceItem(1.0, 20, 5)]
    assert blocks_needed(items, 16, 1024) == 10
    assert blocks_needed(items, 16, 64) == 4  # a request ends at max_model_len
    assert blocks_needed([], 16, 1024) == 1


def test_a_kv_capacity_below_a_recorded_requests_need_is_refused() -> None:
    session = {"config": CONFIG, "knobs": Knobs().model_dump()}
    twin = twin_from_recording(session, fake_session(60), records())
    assert twin.context["min_blocks"] == 10
    assert twin.candidate({"kv_capacity_blocks": 10}).kv_capacity_blocks == 10
    with pytest.raises(InvalidInput, match="must be at least 10") as refused:
        twin.candidate({"kv_capacity_blocks": 9})
    assert refused.value.param == "kv_capacity_blocks"


def test_priorities_reach_the_twin_and_its_search() -> None:
    """A recorded session's priorities go into its trace, and only then does a search try
    the `priority` policy (without them it orders as fcfs)."""
    session = {"config": CONFIG, "knobs": Knobs().model_dump()}
    plain = twin_from_recording(session, fake_session(60), records())
    assert [t.priority for t in plain.trace] == [0, 0, 0]
    assert "priority" not in knob_values("policy", plain.knobs, plain.context, plain.trace)
    ranked = [{**r, "priority": p} for r, p in zip(records(), [2, None, -1], strict=True)]
    twin = twin_from_recording(session, fake_session(60), ranked)
    assert [t.priority for t in twin.trace] == [2, 0, -1]
    assert "priority" in knob_values("policy", twin.knobs, twin.context, twin.trace)
