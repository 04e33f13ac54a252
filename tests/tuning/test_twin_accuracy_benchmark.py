"""The twin-accuracy benchmark's judging, on made-up replays (its runs need servers): the A/A
floor, the pairs it ranks, and the load shapes it sends."""

from typing import Any

import pytest

from benchmarks.control import twin_accuracy as bench


def run(ttft_p90: float, tpot: float = 10.0) -> dict[str, Any]:
    return {
        "throughput_tok_s": 100.0,
        "ttft_p50_ms": ttft_p90 / 2,
        "ttft_p90_ms": ttft_p90,
        "tpot_p50_ms": tpot,
        "tpot_p90_ms": tpot,
        "wall_s": 20.0,
    }


def test_the_aa_floor_is_the_defaults_spread_over_their_median() -> None:
    floor = bench.aa_floor([run(100.0), run(120.0), run(80.0)])
    assert floor["ttft_p90_ms"] == pytest.approx(0.4)
    assert floor["throughput_tok_s"] == 0.0


def test_only_pairs_apart_by_more_than_the_floor_are_ranked() -> None:
    def judged(predicted: float, measured: float) -> dict[str, Any]:
        cell = {"predicted": predicted, "median": measured}
        return {"cells": dict.fromkeys(bench.METRICS, cell)}

    settings = {"a": judged(1.0, 100.0), "b": judged(2.0, 110.0), "c": judged(0.5, 300.0)}
    floor = dict.fromkeys(bench.METRICS, 0.2)
    ranks = bench.ranking(settings, floor)["ttft_p90_ms"]
    # a-b differ by 10% (within the floor); a-c and b-c by far more: c is ranked below both
    assert ranks == {"pairs": 2, "agree": 0}


def test_the_shapes_differ_as_named() -> None:
    uniform, tailed, bursty = (bench.arrivals_of(s, 20.0, 0) for s in bench.SHAPES)
    assert all(16 <= a.prompt_len <= 256 for a in uniform)
    assert (
        max(a.prompt_len for a in tailed)
        > 4 * sorted(a.prompt_len for a in tailed)[len(tailed) // 2]
    )
    assert sum(a.prompt_len >= 800 for a in bursty) > 0.2 * len(bursty)
    in_bursts = sum(
        (a.t - bench.BURST_EVERY / 2) % bench.BURST_EVERY < bench.BURST_S for a in bursty
    )
    share = bench.BURST_S / bench.BURST_EVERY
    assert in_bursts > 2 * share * len(bursty)  # arrivals bunch in the bursts


def test_every_replay_sends_prompts_of_its_own() -> None:
    """Two loads with one seed send the same words, which the second finds in the prefix cache
    the first left: no replay shares a seed with another, the recordings or the warm-up."""
    rounds, settings = 3, 7
    seeds = [bench.replay_seed(5, r, i, settings) for r in range(rounds) for i in range(settings)]
    others = {5 + n for n in range(bench.RECORDINGS)} | {5 + bench.WARMUP_SEED}
    assert len(set(seeds)) == rounds * settings and not others & set(seeds)
