"""Expert placement, the modeled all-to-all volume, and the rebalancing algorithm."""

import pytest
import torch
from workloads import make_prompts, run_staggered, tokens

from engine import LLMEngine, SamplingParams
from engine.ep.placement import LayerPlacement, Placement, a2a_bytes, gather_bytes, imbalance
from engine.ep.rebalance import pack, predicted_imbalance, rebalance, replica_counts


def test_contiguous_placement_splits_experts_and_rows_evenly() -> None:
    p = Placement.contiguous(num_layers=2, num_experts=8, ep_size=4)
    assert p.hosted()[1] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert p.token_ranks(10).tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    ranges = [p.row_range(r, 10) for r in range(4)]
    assert ranges == [(0, 3), (3, 5), (5, 8), (8, 10)]
    for r, (start, end) in enumerate(ranges):
        assert (p.token_ranks(10)[start:end] == r).all()


def test_placement_refuses_an_ep_size_that_does_not_divide_the_experts() -> None:
    with pytest.raises(ValueError, match="ep_size"):
        Placement.contiguous(1, 8, 3)


def test_unplaced_expert_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\[2\]"):
        LayerPlacement(((0,), (1,)), num_experts=3)


def test_replicated_expert_splits_its_pairs_between_replicas() -> None:
    layer = LayerPlacement(((0, 1), (0, 2)), num_experts=3)
    experts = torch.tensor([[0], [0], [0], [0], [1], [2]])
    rank, local = layer.destinations(experts, first_row=5)
    # rows 5..8 pick replica row % 2: rank 1 (odd rows) and rank 0 (even rows)
    assert rank.tolist() == [1, 0, 1, 0, 0, 1]
    assert local.tolist() == [0, 0, 0, 0, 1, 1]
    loads = layer.rank_loads(torch.tensor([10.0, 4.0, 2.0]))
    assert loads.tolist() == [9.0, 7.0]


def test_a2a_bytes_counts_dispatch_and_combine_in_their_directions() -> None:
    pairs = torch.tensor([[[5, 3], [1, 7]], [[0, 2], [4, 0]]])  # [layers, src, dst]
    sent = a2a_bytes(pairs, bytes_per_pair=10)
    # 0 -> 1: 0's pairs computed on 1 (3 + 2) plus results of 1's pairs computed on 0 (1 + 4)
    assert sent == [[0, 100], [100, 0]]
    assert a2a_bytes(torch.tensor([[[3, 6], [0, 0]]]), 1) == [[0, 6], [6, 0]]


def test_gather_bytes_send_each_padded_share_to_every_other_rank() -> None:
    # 7 rows over 3 ranks: shares 3, 2, 2, each padded to 3 rows; 2 layers of 10-byte rows
    assert gather_bytes(3, 7, layers=2, row_bytes=10) == [[0, 60, 60], [60, 0, 60], [60, 60, 0]]
    assert gather_bytes(1, 7, layers=2, row_bytes=10) == [[0]]


def test_imbalance_weighs_each_layer_by_its_busiest_rank() -> None:
    assert imbalance(torch.tensor([[5, 5], [5, 5]])) == 1.0
    assert imbalance(torch.tensor([[9, 1], [5, 5]])) == pytest.approx(14 / 10)
    assert imbalance(torch.zeros(2, 2)) == 1.0


def test_replicas_go_to_the_heaviest_shares() -> None:
    assert replica_counts([100.0, 10.0, 1.0, 1.0], ep_size=2, extra=2) == [2, 2, 1, 1]
    assert replica_counts([100.0, 10.0, 1.0, 1.0], ep_size=4, extra=2) == [3, 1, 1, 1]
    assert replica_counts([5.0, 5.0], ep_size=2, extra=9) == [2, 2]


@pytest.mark.parametrize("ep_size,extra", [(2, 0), (2, 3), (4, 0), (4, 5)])
def test_pack_places_every_expert_with_even_slots(ep_size: int, extra: int) -> None:
    gen = torch.Generator().manual_seed(ep_size + extra)
    load = (torch.rand(16, generator=gen) ** 4 * 100).tolist()
    slots = pack(load, ep_size, extra)
    hosted = sorted(e for rank in slots for e in rank)
    assert set(hosted) == set(range(16)) and len(hosted) == 16 + extra
    sizes = [len(s) for s in slots]
    assert max(sizes) - min(sizes) <= 1
    assert all(len(set(s)) == len(s) for s in slots)  # no two replicas on one rank


def test_rebalance_lowers_the_imbalance_of_skewed_loads() -> None:
    skew = torch.exp(-0.6 * torch.arange(8, dtype=torch.float))
    loads = torch.stack([skew * 1000, skew.flip(0) * 1000])  # two layers, opposite hot ends
    old = Placement.contiguous(2, 8, 2)
    new = rebalance(loads, old, replicas=0)
    assert new.version == old.version + 1
    before, after = predicted_imbalance(old, loads), predicted_imbalance(new, loads)
    assert before > 1.5
    assert after < 1.1
    with_replicas = predicted_imbalance(rebalance(loads, old, replicas=2), loads)
    assert with_replicas <= after


def test_auto_rebalance_every_n_steps_keeps_outputs() -> None:
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    batch = make_prompts(12, seed=4)
    args = dict(model="synthetic:tiny", num_kv_blocks=128, block_size=4, router_skew=1.5)
    engine = LLMEngine(ep_size=2, eplb_interval_steps=4, eplb_replicas=1, **args)
    got, tele = run_staggered(engine, batch, params, per_step=2)
    assert tokens(got) == tokens(run_staggered(LLMEngine(**args), batch, params, per_step=2)[0])
    auto = [c for t in tele for c in t["knob_changes"] if c["origin"] == "auto"]
    assert 1 <= len(auto) <= (len(tele) - 1) // 4  # a plan predicted no better is not applied
    assert all(
        after < before for before, after in (c["changes"]["predicted_imbalance"] for c in auto)
    )
    assert [c["changes"]["expert_placement"][1] for c in auto] == list(range(2, len(auto) + 2))
    assert tele[-1]["a2a"]["placement_version"] == len(auto) + 1
    assert tele[0]["a2a"]["imbalance"] > 1.3 > max(t["a2a"]["imbalance"] for t in tele[6:])


def test_automatic_rebalancing_skips_a_plan_predicted_no_better(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import engine.expert_loads as expert_loads

    monkeypatch.setattr(expert_loads, "rebalance", lambda loads, old, replicas: old)
    engine = LLMEngine(model="synthetic:tiny", ep_size=2, eplb_interval_steps=2, router_skew=1.5)
    engine.add_request(list(range(3, 20)), SamplingParams(max_tokens=8, ignore_eos=True))
    changes = [c for _ in range(8) for c in engine.step().telemetry.knob_changes]
    assert changes == [] and engine.placement.version == 1
    assert (
        engine.rebalance(window=8)["imbalance_after"]
        == engine.knob_changes[-1].changes["predicted_imbalance"][0]
    )  # asked for: applied


def test_rebalance_knobs_are_validated_against_the_engine() -> None:
    with pytest.raises(ValueError, match="eplb_interval_steps"):
        LLMEngine(model="synthetic:tiny", eplb_interval_steps=8)
    with pytest.raises(ValueError, match="eplb_replicas"):
        LLMEngine(model="synthetic:tiny", ep_size=2, eplb_replicas=9)
    engine = LLMEngine(model="synthetic:tiny", ep_size=2)
    with pytest.raises(ValueError, match="no expert load"):
        engine.rebalance()
    with pytest.raises(ValueError, match="nothing to rebalance"):
        LLMEngine(model="synthetic:tiny").rebalance()
