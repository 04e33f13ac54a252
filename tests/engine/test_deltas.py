"""A step hands back only what is new for each request; a request's deltas add up to the whole
output its last delta carries."""

from engine import LLMEngine, RequestDelta, RequestOutput, SamplingParams

GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 24}
PROMPT = [256, 1, 2, 3]


def run(
    requests: dict[str, tuple[SamplingParams, bool]],
) -> tuple[dict[str, list[RequestDelta]], dict[str, RequestOutput]]:
    """Every request (its params, whether it streams text) on one engine, to the end: each
    one's deltas, and the whole outputs the steps handed back."""
    engine = LLMEngine(model="synthetic:tiny", num_kv_blocks=64)
    for rid, (params, stream_text) in requests.items():
        engine.add_request(PROMPT, params, request_id=rid, stream_text=stream_text)
    deltas: dict[str, list[RequestDelta]] = {rid: [] for rid in requests}
    outputs: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        result = engine.step()
        for delta in result.deltas:
            deltas[delta.request_id].append(delta)
        assert [o.request_id for o in result.outputs] == [
            d.request_id for d in result.deltas if d.finished
        ]
        outputs.update((o.request_id, o) for o in result.outputs)
    return deltas, outputs


def test_deltas_add_up_to_the_whole_output() -> None:
    plain = run({"plain": (SamplingParams(**GREEDY), False)})[1]["plain"]
    clean = [i for i in range(6, len(plain.text) - 3) if "\ufffd" not in plain.text[i : i + 3]]
    stop = plain.text[clean[0] : clean[0] + 3]
    deltas, outputs = run(
        {
            "plain": (SamplingParams(**GREEDY), False),
            "stream": (SamplingParams(**GREEDY), True),
            "logprobs": (SamplingParams(**GREEDY, logprobs=2), False),
            "stop": (SamplingParams(**GREEDY, stop=[stop]), False),
        }
    )
    for rid, out in outputs.items():
        parts = deltas[rid]
        assert [d.finished for d in parts] == [False] * (len(parts) - 1) + [True]
        assert parts[-1].output is out and parts[-1].finish_reason == out.finish_reason
        assert all(len(d.token_ids) == len(d.token_times_s) == 1 for d in parts)
        assert [t for d in parts for t in d.token_ids] == out.token_ids
        assert [t for d in parts for t in d.token_times_s] == out.token_times_s
        assert "".join(d.text for d in parts) == out.text
    assert outputs["plain"].token_ids == outputs["stream"].token_ids == plain.token_ids
    assert outputs["logprobs"].token_ids == plain.token_ids
    assert outputs["plain"].text == outputs["stream"].text == plain.text
    # text is decoded once, at the end, unless it streams or must be searched for stop strings
    assert not any(d.text for d in deltas["plain"][:-1])
    assert sum(bool(d.text) for d in deltas["stream"]) > 1
    assert outputs["stop"].text == plain.text[: plain.text.index(stop)]
    assert outputs["stop"].finish_reason == "stop"
    logprobs = outputs["logprobs"].logprobs
    assert logprobs is not None and len(logprobs) == len(plain.token_ids)
    assert [lp for d in deltas["logprobs"] for lp in d.logprobs or []] == logprobs
    assert all(d.logprobs is None for d in deltas["plain"]) and outputs["plain"].logprobs is None
