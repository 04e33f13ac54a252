"""Overlap: step N+1 is scheduled and planned while step N runs on the compute thread. Outputs
must be token for token those of the engine without overlap, whatever happens meanwhile:
streaming, stop strings, logprobs, aborts, preemption, knob changes, expert parallel."""

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import LLMEngine, RequestOutput, SamplingParams, engine_config
from engine.loop import EngineLoop
from engine.outputs import RequestDelta
from engine.telemetry import StepTelemetry
from tests.engine.hf_checkpoints import make_checkpoint
from tests.engine.workloads import make_prompts, run_staggered, tokens


def engine(overlap: bool, **kwargs: Any) -> LLMEngine:
    return LLMEngine(model="synthetic:tiny", overlap=overlap, threads=1, **kwargs)


def run(eng: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, Any]:
    """Run every prompt to its end: outputs, deltas by request, telemetry records."""
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    outputs: dict[str, RequestOutput] = {}
    deltas: dict[str, list[RequestDelta]] = {i: [] for i in ids}
    records: list[StepTelemetry] = []
    while eng.has_unfinished():
        result = eng.step()
        records.append(result.telemetry)
        for d in result.deltas:
            deltas[d.request_id].append(d)
        outputs.update({o.request_id: o for o in result.outputs})
    eng.close()
    return {
        "outputs": [outputs[i] for i in ids],
        "deltas": [deltas[i] for i in ids],
        "records": records,
    }


def mixed_params(n: int) -> list[SamplingParams]:
    """Greedy requests of varied lengths; some stop at EOS, some want logprobs, some are
    seeded random samples (reproducible per request, so equal with and without overlap)."""
    out = []
    for i in range(n):
        if i % 5 == 4:
            out.append(SamplingParams(max_tokens=12 + i, temperature=0.9, top_k=20, seed=i))
        else:
            out.append(
                SamplingParams(
                    max_tokens=8 + 3 * i,
                    temperature=0.0,
                    ignore_eos=i % 2 == 0,
                    logprobs=2 if i % 3 == 0 else None,
                )
            )
    return out


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for x, y in zip(a["outputs"], b["outputs"], strict=True):
        assert (x.token_ids, x.finish_reason, x.text) == (y.token_ids, y.finish_reason, y.text)
        # the batches differ (a preemption may fall on another step), and with them the
        # last bits of the float sums: the same tokens, their log-probabilities within 1e-4
        for lx, ly in zip(x.logprobs or [], y.logprobs or [], strict=True):
            assert lx.keys() == ly.keys()
            assert lx == pytest.approx(ly, abs=1e-4)
        assert (x.logprobs is None) == (y.logprobs is None)


def no_leaks(eng: LLMEngine) -> None:
    assert eng.blocks.num_used == 0
    assert eng.blocks.num_free + eng.blocks.num_cached == eng.blocks.total
    assert len(eng.blocks.host_free) == eng.blocks.num_host_blocks


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_same_tokens_with_and_without_overlap_under_preemption(mode: str) -> None:
    prompts, params = make_prompts(14, seed=3), mixed_params(14)
    kwargs = dict(num_kv_blocks=14, num_host_blocks=64, preemption_mode=mode, max_num_seqs=8)
    off = run(engine(False, **kwargs), prompts, params)
    eng = engine(True, **kwargs)
    on = run(eng, prompts, params)
    assert_same(off, on)
    assert sum(r.queue.preempted for r in on["records"]) > 0  # the test exercised preemption
    assert any(o.num_preemptions for o in on["outputs"])
    no_leaks(eng)


def test_deltas_stream_the_whole_output() -> None:
    prompts, params = make_prompts(6, seed=5), mixed_params(6)
    on = run(engine(True), prompts, params)
    for out, deltas in zip(on["outputs"], on["deltas"], strict=True):
        assert [t for d in deltas for t in d.token_ids] == out.token_ids
        assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
        assert deltas[-1].output == out
        if out.logprobs is not None:
            assert [lp for d in deltas for lp in d.logprobs or []] == out.logprobs


def test_streamed_text_and_stop_strings() -> None:
    plain = engine(False)
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    whole = plain.add_request("hello there", greedy)
    text = ""
    while plain.has_unfinished():
        text += "".join(d.text for d in plain.step().deltas if d.request_id == whole)
    assert len(text) > 12
    stops = (text[8:10], text[3:4], "\x00never")  # text the model does write, and some it does not

    def go(overlap: bool) -> list[tuple[str, str, str | None]]:
        eng = engine(overlap)
        params = [
            SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=[stop])
            for stop in stops
        ]
        ids = [eng.add_request("hello there", p, stream_text=True) for p in params]
        texts = dict.fromkeys(ids, "")
        final: dict[str, RequestOutput] = {}
        while eng.has_unfinished():
            result = eng.step()
            for d in result.deltas:
                texts[d.request_id] += d.text
            final.update({o.request_id: o for o in result.outputs})
        eng.close()
        return [(texts[i], final[i].text, final[i].finish_reason) for i in ids]

    off, on = go(False), go(True)
    assert off == on
    assert all(streamed == text for streamed, text, _ in on)
    assert [reason for *_, reason in on] == ["stop", "stop", "length"]


def test_abort_while_a_step_is_in_flight_frees_every_block() -> None:
    prompts = make_prompts(8, seed=7)
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)] * 8
    off = run(engine(False), prompts, params)
    eng = engine(True)
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    outputs: dict[str, RequestOutput] = {}
    aborted = {ids[1], ids[4], ids[6]}
    for step in range(200):
        if not eng.has_unfinished():
            break
        if step == 6:
            for rid in aborted:  # their rows in the step in flight are wasted
                assert eng.abort(rid) is not None
        result = eng.step()
        assert not aborted & {d.request_id for d in result.deltas if step > 6}
        outputs.update({o.request_id: o for o in result.outputs})
    assert set(outputs) == set(ids) - aborted
    for i, rid in enumerate(ids):
        if rid not in aborted:
            assert outputs[rid].token_ids == off["outputs"][i].token_ids
    eng.close()
    no_leaks(eng)


def test_knob_change_mid_run_applies_at_a_step_boundary() -> None:
    prompts, params = make_prompts(10, seed=9), mixed_params(10)
    off = run(engine(False), prompts, params)
    eng = engine(True)
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    outputs: dict[str, RequestOutput] = {}
    records: list[StepTelemetry] = []
    version = None
    while eng.has_unfinished():
        if len(records) == 5:
            version = eng.update_knobs(max_num_seqs=2, origin="test")
        result = eng.step()
        records.append(result.telemetry)
        outputs.update({o.request_id: o for o in result.outputs})
    eng.close()
    assert [outputs[i].token_ids for i in ids] == tokens(off["outputs"])
    applied = [r for r in records if r.knobs_version == version]
    assert applied, "the change never applied"
    assert sum(bool(r.knob_changes) for r in records) == 1
    assert all(len(r.batch.slots) <= 2 for r in applied)
    first = records.index(applied[0])
    assert all(r.knobs_version == version for r in records[first:])  # versions never go back


def test_expert_parallel_modeled_steps_and_rebalance() -> None:
    prompts, params = make_prompts(8, seed=11), mixed_params(8)
    kwargs = dict(ep_size=2, router_skew=1.5)
    off = run(engine(False, **kwargs), prompts, params)
    eng = engine(True, **kwargs)
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    outputs: dict[str, RequestOutput] = {}
    records: list[StepTelemetry] = []
    while eng.has_unfinished():
        if len(records) == 4:
            eng.rebalance(window=4)
        result = eng.step()
        records.append(result.telemetry)
        outputs.update({o.request_id: o for o in result.outputs})
    eng.close()
    assert [outputs[i].token_ids for i in ids] == tokens(off["outputs"])
    assert all(r.a2a.mode == "modeled" and r.a2a.ep_size == 2 for r in records)
    assert any(sum(map(sum, r.a2a.bytes)) > 0 for r in records)
    versions = [r.a2a.placement_version for r in records]
    assert len(set(versions)) == 2 and versions == sorted(versions)


def test_telemetry_reports_host_and_hidden_time() -> None:
    prompts = make_prompts(16, seed=13)
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)] * 16
    for overlap in (False, True):
        records = run(engine(overlap), prompts, params)["records"]
        decode = [r.dur_ms for r in records if r.batch.num_decode_tokens]
        assert all(d.host > 0 and 0 <= d.hidden <= d.host + 1e-3 for d in decode)
        assert all(d.forward > 0 for d in decode)
        if not overlap:  # how much is hidden with overlap depends on the threads' timing
            assert all(d.hidden == 0 for d in decode)


def test_staggered_arrivals_and_prefix_cache() -> None:
    prompts = make_prompts(12, seed=17)
    params = SamplingParams(max_tokens=10, temperature=0.0)
    off, _ = run_staggered(engine(False), prompts, params)
    eng = engine(True)
    on, _ = run_staggered(eng, prompts, params)
    assert tokens(on) == tokens(off)
    no_leaks(eng)


def test_switching_overlap_off_finishes_the_step_in_flight() -> None:
    prompts, params = make_prompts(4, seed=19), mixed_params(4)
    off = run(engine(False), prompts, params)
    eng = engine(True)
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    outputs: dict[str, RequestOutput] = {}
    steps = 0
    while eng.has_unfinished():
        eng.overlap = steps % 7 < 4  # on and off again, mid-run
        outputs.update({o.request_id: o for o in eng.step().outputs})
        steps += 1
    eng.close()
    assert [outputs[i].token_ids for i in ids] == tokens(off["outputs"])


def test_checkpoint_greedy_outputs_match(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, "mixtral")
    prompts = make_prompts(6, seed=23)
    prompts = [[t % 120 + 3 for t in p] for p in prompts]  # inside the checkpoint's vocabulary
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)] * 6
    results = []
    for overlap in (False, True):
        eng = LLMEngine(model=str(path), num_kv_blocks=64, overlap=overlap, threads=1)
        results.append(run(eng, prompts, params))
    assert_same(*results)


def test_compute_thread_uses_the_engine_threads_torch_threads() -> None:
    eng = engine(True)  # threads=1
    seen: list[int] = []
    execute = eng.runner.execute

    def recording_execute(plan: Any, previous: Any) -> Any:
        seen.append(torch.get_num_threads())
        return execute(plan, previous)

    eng.runner.execute = recording_execute  # type: ignore[method-assign]
    run(eng, make_prompts(3, seed=29), mixed_params(3))
    assert seen and set(seen) == {1}


def test_engine_loop_streams_with_overlap() -> None:
    prompts = make_prompts(4, seed=31)
    params = [SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)] * 4
    expected = tokens(run(engine(False), prompts, params)["outputs"])
    loop = EngineLoop(engine(True))
    loop.start()
    got: dict[int, list[int]] = {i: [] for i in range(4)}
    ended = [threading.Event() for _ in range(4)]
    try:
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):

            def on_output(delta: RequestDelta, i: int = i) -> None:
                got[i] += delta.token_ids
                if delta.finished:
                    ended[i].set()

            loop.submit(p, sp, on_output)
        for event in ended:
            assert event.wait(60), "a request never finished"
    finally:
        loop.stop()
    assert [got[i] for i in range(4)] == expected


def test_the_overlap_engine_argument_turns_it_on() -> None:
    """`overlap` is an engine argument (stored on EngineConfig): off by default, and on from
    the flat arguments or a config; the steps then run on the compute thread."""
    assert not engine_config().overlap and not LLMEngine(model="synthetic:tiny").overlap
    assert LLMEngine(engine_config(overlap=True)).overlap
    eng = engine(True)
    assert eng.config.overlap and eng.overlap
    names: list[str] = []
    execute = eng.runner.execute

    def recording_execute(plan: Any, previous: Any) -> Any:
        names.append(threading.current_thread().name)
        return execute(plan, previous)

    eng.runner.execute = recording_execute  # type: ignore[method-assign]
    run(eng, make_prompts(2, seed=37), mixed_params(2))
    assert names and all(n.startswith("moescope-compute") for n in names)
    with pytest.raises(ValueError, match="overlap must be true or false"):
        engine_config(overlap="yes")
