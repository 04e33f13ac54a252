"""Sampler rules (greedy, seeds, top-k, top-p, temperature, logprobs) and their engine behaviour."""

from collections.abc import Callable

import pydantic
import pytest
import torch

from engine import LLMEngine, RequestOutput, SamplingParams
from engine.sampling import Sampler

VOCAB = 50
EOS = 257


def random_logits(rows: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def draw(sampler: Sampler, logits: torch.Tensor, params: SamplingParams, rid: str) -> list[int]:
    """Sample each row of `logits` in turn for one request."""
    return [sampler.sample(row[None], [rid], [params]).token_ids[0] for row in logits]


def test_greedy_is_argmax() -> None:
    logits = random_logits(16, seed=0)
    greedy = SamplingParams(temperature=0)
    out = Sampler(0).sample(logits, [f"r{i}" for i in range(16)], [greedy] * 16)
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 16


def test_same_seed_same_tokens_different_seed_differs() -> None:
    logits = random_logits(12, seed=1) / 3
    seeded = SamplingParams(temperature=1.0, seed=1234)
    first = draw(Sampler(0), logits, seeded, "a")
    second = draw(Sampler(99), logits, seeded, "b")
    other = draw(Sampler(0), logits, SamplingParams(temperature=1.0, seed=4321), "a")
    assert first == second
    assert first != other


def test_seeded_requests_do_not_disturb_each_other() -> None:
    logits = random_logits(10, seed=2) / 3
    params = SamplingParams(temperature=1.0, seed=7)
    alone = draw(Sampler(0), logits, params, "a")
    sampler = Sampler(0)
    mixed = []
    for row in logits:
        batch = torch.stack([row, row, row])
        out = sampler.sample(
            batch,
            ["noise", "a", "b"],
            [SamplingParams(temperature=1.0), params, SamplingParams(seed=8)],
        )
        mixed.append(out.token_ids[1])
    assert mixed == alone


def test_forget_restarts_a_seeded_stream() -> None:
    logits = random_logits(8, seed=3) / 3
    params = SamplingParams(temperature=1.0, seed=5)
    sampler = Sampler(0)
    first = draw(sampler, logits, params, "a")
    sampler.forget("a")
    assert draw(sampler, logits, params, "a") == first


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.5, top_k=1),
        SamplingParams(temperature=1.5, top_p=1e-6),
        SamplingParams(temperature=0.7, top_k=1, top_p=0.5),
        # past float32's range: 1/temperature overflows, top_p rounds to 0 in float32
        SamplingParams(temperature=1e-40),
        SamplingParams(temperature=5e-324, top_k=3),
        SamplingParams(top_p=1e-300),
        SamplingParams(temperature=1e-40, top_p=1e-300),
    ],
)
def test_narrow_cuts_equal_greedy(params: SamplingParams) -> None:
    logits = random_logits(32, seed=4)
    rids = [f"r{i}" for i in range(32)]
    out = Sampler(0).sample(logits, rids, [params] * 32)
    assert out.token_ids == logits.argmax(-1).tolist()


def frequencies(params: SamplingParams, logits: list[float], n: int = 4000) -> list[float]:
    batch = torch.tensor([logits]).repeat(n, 1)
    tokens = Sampler(11).sample(batch, [f"r{i}" for i in range(n)], [params] * n).token_ids
    return [tokens.count(t) / n for t in range(len(logits))]


LOGITS4 = [0.0, 1.0, 2.0, 0.5]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_frequencies_follow_softmax(temperature: float) -> None:
    freq = frequencies(SamplingParams(temperature=temperature), LOGITS4)
    expected = torch.softmax(torch.tensor(LOGITS4) / temperature, -1).tolist()
    for f, p in zip(freq, expected, strict=True):
        assert abs(f - p) < 0.03, (freq, expected)


def test_top_k_frequencies_renormalise_over_the_k_best() -> None:
    freq = frequencies(SamplingParams(temperature=1.0, top_k=2), LOGITS4)
    kept = torch.softmax(torch.tensor([1.0, 2.0]), -1).tolist()
    assert freq[0] == freq[3] == 0.0
    assert abs(freq[1] - kept[0]) < 0.03
    assert abs(freq[2] - kept[1]) < 0.03


def test_top_p_keeps_the_smallest_nucleus() -> None:
    probs = torch.softmax(torch.tensor(LOGITS4), -1)  # about [.10, .28, .46, .17]
    freq = frequencies(SamplingParams(temperature=1.0, top_p=0.6), LOGITS4)
    assert freq[0] == freq[3] == 0.0
    kept = probs[[1, 2]] / probs[[1, 2]].sum()
    assert abs(freq[1] - float(kept[0])) < 0.03
    assert abs(freq[2] - float(kept[1])) < 0.03


def test_logprobs_top_n_plus_chosen_equal_log_softmax() -> None:
    logits = torch.tensor([[5.0, 4.0, 0.0, 0.0, -1.0, 0.5]]).repeat(40, 1)
    params = SamplingParams(temperature=100.0, logprobs=2)
    out = Sampler(3).sample(logits, [f"r{i}" for i in range(40)], [params] * 40)
    lp = torch.log_softmax(logits[0], -1)
    outside = 0
    for token, got in zip(out.token_ids, out.logprobs, strict=True):
        assert got is not None
        assert set(got) == {0, 1, token}
        outside += token not in (0, 1)
        for t, v in got.items():
            assert v == pytest.approx(float(lp[t]), abs=1e-6)
    assert outside > 0


def test_logprobs_zero_gives_only_the_chosen_token() -> None:
    logits = random_logits(4, seed=5)
    params = SamplingParams(temperature=0, logprobs=0)
    out = Sampler(0).sample(logits, list("abcd"), [params] * 4)
    lp = torch.log_softmax(logits, -1)
    for row, (token, got) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        assert got == {token: pytest.approx(float(lp[row, token]), abs=1e-6)}


# through the engine


def make_engine() -> LLMEngine:
    return LLMEngine(model="synthetic:tiny", num_kv_blocks=32, block_size=4, num_host_blocks=0)


def run_all(engine: LLMEngine, max_steps: int = 200) -> dict[str, RequestOutput]:
    done: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return done
        for out in engine.step().outputs:
            if out.finished:
                done[out.request_id] = out
    raise AssertionError(f"requests still unfinished after {max_steps} steps")


def generate(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> RequestOutput:
    rid = engine.add_request(prompt, params)
    return run_all(engine)[rid]


PROMPT = [256, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]


def test_seed_is_reproducible_across_engines() -> None:
    params = SamplingParams(temperature=1.0, seed=2024, max_tokens=10, ignore_eos=True)
    first = generate(make_engine(), PROMPT, params)
    busy = make_engine()
    busy.add_request([256, 1, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams(max_tokens=6))
    second = generate(busy, PROMPT, params)
    other = generate(make_engine(), PROMPT, params.model_copy(update={"seed": 2025}))
    assert first.token_ids == second.token_ids
    assert len(first.token_ids) == 10
    assert first.token_ids != other.token_ids


def test_max_tokens_finishes_with_length() -> None:
    out = generate(make_engine(), PROMPT, SamplingParams(temperature=0, max_tokens=7))
    assert out.finished
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 7


def test_stop_token_ids_stop_at_first_occurrence() -> None:
    greedy = generate(make_engine(), PROMPT, SamplingParams(temperature=0, max_tokens=12)).token_ids
    stop = greedy[4]
    cut = greedy.index(stop)
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop, 1000))
    out = generate(make_engine(), PROMPT, params)
    assert out.finish_reason == "stop"
    assert out.token_ids == greedy[: cut + 1]


@pytest.fixture
def eos_engine(monkeypatch: pytest.MonkeyPatch) -> LLMEngine:
    """An engine whose model always makes EOS the most likely token."""
    engine = make_engine()
    compute_logits: Callable[[torch.Tensor], torch.Tensor] = engine.model.compute_logits

    def eos_first(hidden: torch.Tensor) -> torch.Tensor:
        logits = compute_logits(hidden)
        logits[:, EOS] += 1e4
        return logits

    monkeypatch.setattr(engine.model, "compute_logits", eos_first)
    return engine


def test_eos_stops_unless_ignored(eos_engine: LLMEngine) -> None:
    assert eos_engine.model_config.eos_token_ids == (EOS,)
    stopped = generate(eos_engine, PROMPT, SamplingParams(temperature=0, max_tokens=5))
    assert (stopped.token_ids, stopped.finish_reason) == ([EOS], "stop")
    ignored = generate(
        eos_engine, PROMPT, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    )
    assert (ignored.token_ids, ignored.finish_reason) == ([EOS] * 5, "length")


def test_stop_token_ids_apply_even_with_ignore_eos(eos_engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, stop_token_ids=(EOS,))
    out = generate(eos_engine, PROMPT, params)
    assert (out.token_ids, out.finish_reason) == ([EOS], "stop")


def test_engine_logprobs_match_the_model_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine()
    compute_logits = engine.model.compute_logits
    seen: list[torch.Tensor] = []

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        logits = compute_logits(hidden)
        seen.append(logits.clone())
        return logits

    monkeypatch.setattr(engine.model, "compute_logits", recording)
    out = generate(engine, PROMPT, SamplingParams(temperature=0, max_tokens=4, logprobs=3))
    assert out.logprobs is not None
    assert len(out.logprobs) == len(out.token_ids) == len(seen) == 4
    for token, got, logits in zip(out.token_ids, out.logprobs, seen, strict=True):
        lp = torch.log_softmax(logits[0], -1)
        assert token == int(lp.argmax())
        assert set(got) == set(lp.topk(3).indices.tolist())
        for t, v in got.items():
            assert v == pytest.approx(float(lp[t]), abs=1e-5)


def test_no_logprobs_unless_asked() -> None:
    out = generate(make_engine(), PROMPT, SamplingParams(temperature=0, max_tokens=2))
    assert out.logprobs is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("temperature", -0.5),
        ("top_k", -1),
        ("logprobs", 21),
        ("logprobs", -1),
    ],
)
def test_sampling_params_validation_names_the_field(field: str, value: float) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        SamplingParams(**{field: value})
    assert [e["loc"] for e in info.value.errors()] == [(field,)]
    assert field in str(info.value)


@pytest.mark.parametrize("seed", [-(2**63), 2**64 - 1])
def test_seeds_at_the_ends_of_the_generator_range_sample(seed: int) -> None:
    params = SamplingParams(seed=seed)
    logits = random_logits(4, seed=2)
    assert draw(Sampler(0), logits, params, "a") == draw(Sampler(1), logits, params, "a")


@pytest.mark.parametrize("seed", [-(2**63) - 1, 2**64])
def test_seeds_past_the_generator_range_are_refused(seed: int) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        SamplingParams(seed=seed)
    assert [e["loc"] for e in info.value.errors()] == [("seed",)]


def test_sampling_params_refuse_unknown_fields() -> None:
    with pytest.raises(pydantic.ValidationError, match="best_of"):
        SamplingParams(best_of=2)
