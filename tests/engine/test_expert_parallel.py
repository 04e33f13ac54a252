"""Expert parallel over 2 real ranks (gloo, spawned processes) against one process."""

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import torch
from workloads import make_prompts, run_staggered, tokens

from engine import LLM, LLMEngine, SamplingParams
from engine.loop import EngineDead, EngineLoop
from engine.outputs import RequestDelta

pytestmark = pytest.mark.slow
TIMEOUT = 60.0  # for a wait on a condition: generous, since only a hang should ever reach it

PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=4)
ARGS = dict(
    model="synthetic:tiny",
    num_kv_blocks=64,
    block_size=4,
    prefill_chunk_size=8,
    max_num_batched_tokens=32,
    max_num_seqs=8,
    router_skew=1.5,
)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(10, seed=3)


@pytest.fixture(scope="module")
def reference(prompts: list[list[int]]) -> tuple[list, list[dict]]:
    """The same workload in one process, modeling 2 ranks."""
    return run_staggered(LLMEngine(ep_size=2, **ARGS), prompts, PARAMS)


@pytest.fixture(scope="module")
def ranks2() -> Iterator[LLMEngine]:
    engine = LLMEngine(ep_size=2, ep_distributed=True, **ARGS)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def ep_run(ranks2: LLMEngine, prompts: list[list[int]]) -> tuple[list, list[dict]]:
    return run_staggered(ranks2, prompts, PARAMS)


def _assert_same_outputs(got: list, want: list) -> None:
    assert tokens(got) == tokens(want)
    for a, b in zip(got, want, strict=True):
        for pos_a, pos_b in zip(a.logprobs, b.logprobs, strict=True):
            assert pos_a.keys() == pos_b.keys()
            for token, value in pos_a.items():
                assert value == pytest.approx(pos_b[token], abs=1e-5)


def test_two_ranks_equal_one_process(ranks2, ep_run, reference) -> None:
    got, tele = ep_run
    _assert_same_outputs(got, reference[0])
    assert any(t["batch"]["num_prefill_tokens"] and t["batch"]["num_decode_tokens"] for t in tele)
    assert ranks2.blocks.num_used == 0


def test_measured_bytes_equal_the_modeled_figure(ep_run, reference) -> None:
    tele = ep_run[1]
    modeled = reference[1]
    assert len(tele) == len(modeled)
    assert {t["a2a"]["mode"] for t in tele} == {"measured"}
    assert {t["a2a"]["mode"] for t in modeled} == {"modeled"}
    for got, want in zip(tele, modeled, strict=True):
        assert got["experts"]["counts"] == want["experts"]["counts"]
        assert got["a2a"]["bytes"] == want["a2a"]["bytes"]
        assert got["a2a"]["gather_bytes"] == want["a2a"]["gather_bytes"]
        assert got["a2a"]["rank_tokens"] == want["a2a"]["rank_tokens"]
        assert len(got["a2a"]["rank_moe_ms"]) == 2
    total = sum(sum(map(sum, t["a2a"]["bytes"])) for t in tele)
    assert total > 0
    assert all(t["a2a"]["bytes"][0][0] == t["a2a"]["bytes"][1][1] == 0 for t in tele)


def test_swap_preemption_and_capacity_drops_match(ranks2, ep_run) -> None:
    knobs = {
        "kv_capacity_blocks": 14,
        "preemption_mode": "swap",
        "expert_capacity_factor": 0.75,
        "eplb_replicas": 0,
    }
    fresh = make_prompts(10, seed=7)
    want, want_tele = run_staggered(LLMEngine(**ARGS, num_host_blocks=64, **knobs), fresh, PARAMS)
    ranks2.update_knobs(**knobs)
    got, tele = run_staggered(ranks2, fresh, PARAMS)
    _assert_same_outputs(got, want)
    assert any(t["queue"]["swapped"] for t in tele)
    dropped = [t["experts"]["dropped"] for t in tele]
    assert dropped == [t["experts"]["dropped"] for t in want_tele]
    assert sum(map(sum, dropped)) > 0
    ranks2.update_knobs(kv_capacity_blocks=None, expert_capacity_factor=None)


def test_rebalance_keeps_outputs_and_lowers_rank_imbalance(ranks2) -> None:
    summary = ranks2.rebalance(window=64, replicas=1)
    assert summary["imbalance_after"] < summary["imbalance_before"]
    assert summary["moved_bytes"] > 0
    assert ranks2.knob_changes[-1].changes["expert_placement"] == [
        summary["placement_version"] - 1,
        summary["placement_version"],
    ]
    fresh = make_prompts(12, seed=6)
    got, tele = run_staggered(ranks2, fresh, PARAMS)
    single = LLMEngine(ep_size=2, **ARGS)
    want, before = run_staggered(single, fresh, PARAMS)
    _assert_same_outputs(got, want)
    assert (
        tele[0]["knob_changes"][-1]["changes"]["expert_placement"][1]
        == summary["placement_version"]
    )
    assert {t["a2a"]["placement_version"] for t in tele} == {summary["placement_version"]}

    def busiest(steps: list[dict]) -> float:
        per_rank = torch.tensor([t["a2a"]["rank_tokens"] for t in steps]).sum(0)
        return per_rank.max().item() / per_rank.float().mean().item()

    assert busiest(tele) < busiest(before) - 0.1


def test_capacity_counts_each_expert_once_across_its_replicas(ranks2) -> None:
    """After the rebalance above, hot experts have 2 copies: each expert still takes at most
    its capacity of pairs in the batch, the same pairs as in one process."""
    assert max(int(layer.replicas.max()) for layer in ranks2.placement.layers) > 1
    ranks2.update_knobs(expert_capacity_factor=0.75)
    fresh = make_prompts(10, seed=8)
    got, tele = run_staggered(ranks2, fresh, PARAMS)
    ranks2.update_knobs(expert_capacity_factor=None)
    single = LLMEngine(ep_size=2, expert_capacity_factor=0.75, **ARGS)
    want, want_tele = run_staggered(single, fresh, PARAMS)
    _assert_same_outputs(got, want)
    dropped = [t["experts"]["dropped"] for t in tele]
    assert dropped == [t["experts"]["dropped"] for t in want_tele] and sum(map(sum, dropped))
    for t in tele + want_tele:  # pairs computed leave the dropped ones out
        routed = sum(map(sum, t["experts"]["counts"]))
        assert sum(t["a2a"]["rank_tokens"]) == routed - sum(t["experts"]["dropped"])


def test_a_dead_rank_fails_requests_clearly_instead_of_hanging(ranks2) -> None:
    """Last in this module: it kills the shared engine's rank 1 mid-request."""
    loop = EngineLoop(ranks2)
    loop.start()
    outputs: list = []
    first, killed = threading.Event(), threading.Event()

    def on_output(delta: RequestDelta) -> None:
        outputs.append(delta)
        if not first.is_set():
            first.set()
            killed.wait(TIMEOUT)  # the engine goes on once rank 1 is dead: mid-request

    long = SamplingParams(max_tokens=240, temperature=0.0, ignore_eos=True)
    try:
        loop.submit([1, 2, 3], long, on_output)
        assert first.wait(TIMEOUT)
        proc = ranks2.ranks.procs[0]
        try:
            proc.kill()
            proc.wait(TIMEOUT)
        finally:
            killed.set()
        loop._thread.join(TIMEOUT)
        assert not loop._thread.is_alive()
        assert loop.error is not None and "rank 1" in loop.error and "exited" in loop.error
        assert outputs[-1].finish_reason == "error" and "rank 1" in outputs[-1].error
        assert sum(len(d.token_ids) for d in outputs[:-1]) < 240
        with pytest.raises(EngineDead, match="rank 1"):
            loop.submit([4, 5, 6], PARAMS, outputs.append)
    finally:
        loop.stop()


def test_offline_llm_with_ranks_closes_them(prompts) -> None:
    """After the dead-rank test closed the shared engine (one distributed engine at a time)."""
    with LLM(ep_size=2, ep_distributed=True, **ARGS) as llm:
        procs = llm.engine.ranks.procs
        got = llm.generate(prompts[:3], PARAMS, use_tqdm=False)
    assert all(p.poll() is not None for p in procs)
    want = LLM(**ARGS).generate(prompts[:3], PARAMS, use_tqdm=False)
    assert tokens(got) == tokens(want)


def test_a_script_without_a_main_guard_can_start_ranks() -> None:
    """Ranks run `python -m engine.ep.worker`, never the caller's script."""
    script = (
        "from engine import LLM, SamplingParams\n"
        "with LLM(ep_size=2, ep_distributed=True, num_kv_blocks=64) as llm:\n"
        "    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3), use_tqdm=False)\n"
        "print('tokens', len(out[0].token_ids))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tokens 3"
