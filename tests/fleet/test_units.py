"""The fleet's parts that need no Ray running: the router's ranking, the fleet knobs, the
work estimate and the merged metrics."""

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import RayActorError

from fleet import state
from fleet.knobs import FleetKnobs
from fleet.metrics_text import merge_metrics
from fleet.relay import relay, work_of
from fleet.routing import FleetRouter


def replica(rid: str, kv_free: float = 1.0) -> Any:
    return SimpleNamespace(
        replica_id=SimpleNamespace(unique_id=rid), routing_stats={"kv_free": kv_free}
    )


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "STATE", state.RoutingState())


def ranked(policy: str, replicas: list[Any]) -> list[str]:
    state.STATE.policy = policy
    router = SimpleNamespace(_turn=itertools.count())
    return [r.replica_id.unique_id for r in FleetRouter.rank(router, replicas)]  # type: ignore[arg-type]


def test_least_work_counts_tokens_in_flight_and_kv_headroom() -> None:
    a, b, c = replica("a"), replica("b"), replica("c", kv_free=0.01)
    state.STATE.sent("r1", "a", 600)
    state.STATE.sent("r2", "b", 20)
    state.STATE.sent("r3", "b", 20)
    # b has more requests but fewer tokens ahead; c is idle but short of KV
    assert ranked("least_work", [a, b, c]) == ["b", "a", "c"]
    state.STATE.ended("r1")
    assert ranked("least_work", [a, b, c]) == ["a", "b", "c"]
    state.STATE.sent("r1", "a", 600)  # routed again after a retry: counted once
    state.STATE.sent("r1", "a", 600)
    assert state.STATE.snapshot()["work"]["a"] == 600


def test_ties_go_to_the_replica_sent_fewest() -> None:
    state.STATE.sent("x", "a", 5)
    state.STATE.ended("x")
    assert ranked("least_work", [replica("a"), replica("b")]) == ["b", "a"]


def test_round_robin_turns_and_a_dead_replica_drops_its_work() -> None:
    state.STATE.policy = "round_robin"
    router = SimpleNamespace(_turn=itertools.count())
    reps = [replica("a"), replica("b"), replica("c")]
    firsts = [FleetRouter.rank(router, reps)[0].replica_id.unique_id for _ in range(4)]  # type: ignore[arg-type]
    assert firsts == ["a", "b", "c", "a"]
    state.STATE.sent("r", "b", 50)
    state.STATE.replica_gone("b")
    assert state.STATE.snapshot()["work"]["b"] == 0


def test_fleet_knobs_are_versioned_and_refuse_bad_values() -> None:
    knobs = FleetKnobs("round_robin")
    assert knobs.current() == {"knobs": {"routing_policy": "round_robin"}, "version": 0}
    knobs.update({"routing_policy": "power_of_two"}, origin="test")
    assert state.STATE.policy == "power_of_two" and knobs.version == 1
    assert knobs.history[-1]["changes"] == {"routing_policy": ["round_robin", "power_of_two"]}
    with pytest.raises(ValueError, match="^routing_policy: must be one of"):
        knobs.update({"routing_policy": "fastest"})
    with pytest.raises(ValueError, match="^max_num_seqs: unknown fleet knob"):
        knobs.update({"max_num_seqs": 4})
    assert knobs.version == 1


def test_work_of_a_completion() -> None:
    assert work_of(b'{"prompt": "abcd", "max_tokens": 10}') == 14
    assert work_of(b'{"prompt": [1, 2, 3], "max_tokens": 2}') == 5
    chat = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'
    assert work_of(chat) == 5
    assert work_of(b"not json") == 1


def test_a_stream_whose_replica_dies_ends_with_one_whole_error_event() -> None:
    async def replica() -> AsyncIterator[bytes]:
        yield b'data: {"choices": [1]}\n\ndata: {"choices"'
        yield b': [2]}\n\ndata: {"cho'  # the replica dies midway through an event
        raise RayActorError()

    async def relayed() -> list[bytes]:
        return [chunk async for chunk in relay(replica())]

    chunks = asyncio.run(relayed())
    events = b"".join(chunks).decode().split("\n\n")
    assert events[:2] == ['data: {"choices": [1]}', 'data: {"choices": [2]}']
    error = json.loads(events[2].removeprefix("data: "))
    assert error["replica_unavailable"] and error["error"]["code"] == 503
    assert events[3:] == [""]


def test_metrics_merge_by_family_with_a_replica_label() -> None:
    text = (
        '# HELP m_a A.\n# TYPE m_a gauge\nm_a{model_name="t"} 1.0\n'
        "# HELP m_b B.\n# TYPE m_b counter\nm_b_total 2.0\n"
    )
    merged = merge_metrics({"r1": text, "r2": text.replace("1.0", "3.0")}).splitlines()
    assert merged == [
        "# HELP m_a A.",
        "# TYPE m_a gauge",
        'm_a{replica="r1",model_name="t"} 1.0',
        'm_a{replica="r2",model_name="t"} 3.0',
        "# HELP m_b B.",
        "# TYPE m_b counter",
        'm_b_total{replica="r1"} 2.0',
        'm_b_total{replica="r2"} 2.0',
    ]


def test_fleet_command_takes_serve_arguments_and_its_own() -> None:
    from cli.fleet import spec_from_args
    from cli.main import build_parser

    args = build_parser().parse_args(
        [
            "fleet",
            "--replicas",
            "3",
            "--routing-policy",
            "round_robin",
            "--threads",
            "1",
            "--max-num-seqs",
            "8",
            "--no-record",
            "--port",
            "9001",
        ]
    )
    spec = spec_from_args(args)
    assert (spec.replicas, spec.policy, spec.port) == (3, "round_robin", 9001)
    assert spec.engine_args["threads"] == 1 and spec.engine_args["max_num_seqs"] == 8
    assert spec.settings.record is False
    with pytest.raises(SystemExit, match="--ep-size"):
        spec_from_args(build_parser().parse_args(["fleet", "--ep", "2"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["fleet", "--routing-policy", "random"])


def test_the_benchmark_workload_and_table() -> None:
    import argparse

    from benchmarks.fleet.replicas import render, workload

    load = workload(400, long=600, short=16, seed=1)
    assert load == workload(400, long=600, short=16, seed=1)
    assert 0.15 < sum(len(p) == 600 for _, p in load) / 400 < 0.35
    assert all(b > a for (a, _), (b, _) in itertools.pairwise(load))

    def run(replicas: int, policy: str, tok_s: float, p90: float) -> dict[str, Any]:
        ttft = {"count": 1, "mean": p90, "p50": p90, "p90": p90, "p99": p90}
        return {
            "replicas": replicas,
            "policy": policy,
            "tok_s": tok_s,
            "ttft": ttft,
            "e2e_p90": 2 * p90,
            "wall_s": 1.0,
        }

    runs = [
        run(1, "least_work", 100, 400),
        run(1, "least_work", 100, 400),
        run(2, "least_work", 200, 100),
        run(2, "round_robin", 200, 200),
        run(2, "least_work", 200, 100),
        run(2, "round_robin", 200, 200),
    ]
    args = argparse.Namespace(requests=6, rate=1.0, long=600, short=16, max_tokens=8)
    text = render(args, [], runs, 1.0)
    assert "2 vs 1 replica: throughput x2.00, TTFT p90 x0.38" in text
    assert "least_work vs round_robin (2 replicas): TTFT p90 x0.50, throughput x1.00" in text
