"""Stop strings end a request in the engine itself, offline as served."""

from engine import LLM, SamplingParams

GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 48}


def test_offline_generate_cuts_the_text_before_a_stop_string() -> None:
    llm = LLM(model="synthetic:tiny")
    prompt = [256, 1, 2, 3]
    full = llm.generate([prompt], SamplingParams(**GREEDY), use_tqdm=False)[0]
    clean = [i for i in range(6, len(full.text) - 3) if "\ufffd" not in full.text[i : i + 3]]
    stop = full.text[clean[0] : clean[0] + 3]
    cut = llm.generate([prompt], SamplingParams(stop=[stop, "never"], **GREEDY), use_tqdm=False)
    out = cut[0]
    assert out.text == full.text[: full.text.index(stop)]
    assert out.finish_reason == "stop" and out.finished
    assert len(out.token_ids) < len(full.token_ids)
    assert out.token_ids == full.token_ids[: len(out.token_ids)]  # greedy: the same tokens
    assert llm.engine.blocks.num_used == 0


def test_a_stop_string_that_never_appears_changes_nothing() -> None:
    llm = LLM(model="synthetic:tiny")
    plain, guarded = (
        llm.generate([[256, 7, 8]], SamplingParams(**GREEDY, **extra), use_tqdm=False)[0]
        for extra in ({}, {"stop": "\x00\x01never"})
    )
    assert (guarded.text, guarded.token_ids) == (plain.text, plain.token_ids)
    assert guarded.finish_reason == "length"
