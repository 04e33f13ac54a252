"""The telemetry bus and the engine loop's text handling, without a server."""

import itertools
import threading
from collections.abc import Iterator

import pytest
from api_servers import MODEL, TIMEOUT, wait_for

from engine import LLMEngine, SamplingParams
from engine.bus import TelemetryBus
from engine.errors import InvalidInput
from engine.loop import EngineDead, EngineLoop
from engine.outputs import RequestDelta, RequestOutput


def test_bus_buffers_are_bounded_and_count_drops() -> None:
    bus = TelemetryBus()
    wakes: list[int] = []
    slow = bus.subscribe(maxlen=3, notify=lambda: wakes.append(1))
    every = bus.subscribe(maxlen=10, every=2)
    for step in range(7):
        bus.publish({"step": step})
    records, dropped = slow.drain()
    assert [r["step"] for r in records] == [4, 5, 6] and dropped == 4
    assert len(wakes) == 1  # only the empty -> non-empty transition wakes the consumer
    assert slow.drain() == ([], 0)
    assert [r["step"] for r in every.drain()[0]] == [0, 2, 4, 6]
    bus.unsubscribe(slow)
    assert bus.num_subscribers == 1


def test_a_broken_subscriber_is_removed() -> None:
    bus = TelemetryBus()

    def boom() -> None:
        raise RuntimeError("event loop closed")

    bus.subscribe(notify=boom)
    ok = bus.subscribe()
    bus.publish({"step": 0})
    assert bus.num_subscribers == 1 and ok.drain()[0] == [{"step": 0}]


@pytest.fixture
def loop() -> Iterator[EngineLoop]:
    lp = EngineLoop(LLMEngine(model=MODEL, num_kv_blocks=64))
    lp.start()
    yield lp
    lp.stop()


def _deltas(
    loop: EngineLoop, prompt: list[int], stop: tuple[str, ...] = (), **params: object
) -> list[RequestDelta]:
    """Every delta of one greedy request that streams its text."""
    deltas: list[RequestDelta] = []
    done = threading.Event()

    def on_output(delta: RequestDelta) -> None:
        deltas.append(delta)
        if delta.finished:
            done.set()

    params = {"temperature": 0.0, "ignore_eos": True, "stop": stop, **params}
    loop.submit(prompt, SamplingParams.model_validate(params), on_output, stream_text=True)
    assert done.wait(TIMEOUT)
    return deltas


def _run(
    loop: EngineLoop, prompt: list[int], stop: tuple[str, ...] = (), **params: object
) -> RequestOutput:
    """The whole output of one greedy request."""
    output = _deltas(loop, prompt, stop, **params)[-1].output
    assert output is not None
    return output


def _stop_inside(text: str) -> str:
    """Three clean characters from the middle of `text`, to use as a stop string."""
    return next(text[i : i + 3] for i in range(6, len(text) - 3) if "\ufffd" not in text[i : i + 3])


def test_streamed_text_settles_and_stop_strings_cut_it(loop: EngineLoop) -> None:
    deltas = _deltas(loop, [256, 1, 2, 3], max_tokens=48)
    texts = list(itertools.accumulate(d.text for d in deltas))
    assert sum(bool(d.text) for d in deltas) > 1  # it streams, not all at the end
    assert not any(t.endswith("\ufffd") for t in texts[:-1])
    full = texts[-1]
    assert deltas[-1].output is not None and deltas[-1].output.text == full
    stop = _stop_inside(full)
    cut = _deltas(loop, [256, 1, 2, 3], (stop,), max_tokens=48)
    assert "".join(d.text for d in cut) == full[: full.index(stop)]
    assert cut[-1].finish_reason == "stop" and cut[-1].finished
    assert cut[-1].output is not None and cut[-1].output.text == full[: full.index(stop)]
    wait_for(lambda: not loop.engine.requests, what="the stopped request to end")
    assert loop.engine.blocks.num_used == 0


def test_a_stop_string_finish_is_in_the_step_latencies(loop: EngineLoop) -> None:
    full = _run(loop, [256, 1, 2, 3], max_tokens=48).text
    stop = _stop_inside(full)
    sub = loop.bus.subscribe()
    cut = _run(loop, [256, 1, 2, 3], (stop,), max_tokens=48)
    assert cut.finish_reason == "stop" and len(cut.token_ids) < 48
    records: list[dict] = []
    wait_for(
        lambda: records.extend(sub.drain()[0]) or any(r["queue"]["finished"] for r in records),
        what="a step that reports the stopped request",
    )
    assert sum(r["queue"]["finished"] for r in records) == 1
    assert sum(len(r["latency"]["ttft_ms"]) for r in records) == 1
    loop.bus.unsubscribe(sub)


def test_refused_requests_and_a_stopped_loop(loop: EngineLoop) -> None:
    with pytest.raises(InvalidInput, match="vocabulary") as refused:
        loop.submit([999], SamplingParams(), lambda _: None)
    assert refused.value.param == "prompt"
    with pytest.raises(InvalidInput, match="origin") as refused:
        loop.update_knobs({"origin": "x"}).result(TIMEOUT)
    assert refused.value.param == "origin"
    with pytest.raises(InvalidInput, match="reason") as refused:
        loop.update_knobs({"reason": "x"}).result(TIMEOUT)
    assert refused.value.param == "reason"
    assert loop.update_knobs({"max_num_seqs": 2}, "autopilot", "why").result(TIMEOUT) == 2
    assert loop.knobs.max_num_seqs == 2
    loop.stop()
    with pytest.raises(EngineDead):
        loop.submit([1], SamplingParams(), lambda _: None)


def test_each_request_ends_in_one_record(loop: EngineLoop) -> None:
    """Finished, stopped-by-string and aborted requests each publish one RequestRecord."""
    sub = loop.requests.subscribe()
    full = _run(loop, [256, 1, 2, 3], max_tokens=12)
    stop = _stop_inside(_run(loop, [256, 1, 2, 3], max_tokens=48).text)
    cut = _run(loop, [256, 1, 2, 3], (stop,), max_tokens=48)
    held = threading.Event()
    aborted = loop.submit(
        [256, 5, 6], SamplingParams(max_tokens=400, ignore_eos=True), lambda _: held.set()
    )
    assert held.wait(10)
    loop.abort(aborted)
    records: list[dict] = []
    wait_for(lambda: records.extend(sub.drain()[0]) or len(records) >= 4, what="4 end records")
    by_id = {r["req"]: r for r in records}
    assert len(records) == len(by_id) == 4
    assert by_id[full.request_id]["finish_reason"] == "length"
    assert by_id[full.request_id]["output_len"] == 12
    assert by_id[cut.request_id]["finish_reason"] == "stop"
    assert by_id[cut.request_id]["output_len"] == len(cut.token_ids)
    assert by_id[aborted]["finish_reason"] == "abort"
    assert all(r["ttft_ms"] is not None and r["e2e_ms"] >= r["ttft_ms"] for r in records)
    loop.requests.unsubscribe(sub)


def test_a_loop_built_on_its_thread_steps_there() -> None:
    """The engine is built on the thread that steps it (and calls back from it), which only
    starts stepping with `start`."""
    built_on: list[threading.Thread] = []

    def make() -> LLMEngine:
        built_on.append(threading.current_thread())
        return LLMEngine(model=MODEL)

    loop = EngineLoop.built_on_its_thread(make)
    assert built_on[0] is not threading.current_thread() and not loop.alive
    seen: list[threading.Thread] = []
    done = threading.Event()

    def on_output(delta: RequestDelta) -> None:
        seen.append(threading.current_thread())
        if delta.finished:
            done.set()

    loop.start()
    try:
        loop.submit([1, 2, 3], SamplingParams(max_tokens=3), on_output)
        assert done.wait(TIMEOUT) and loop.alive
        assert set(seen) == {built_on[0]}
    finally:
        loop.stop()
    assert not built_on[0].is_alive()


def test_a_loop_built_on_its_thread_raises_the_builds_error_and_stops_unstarted() -> None:
    def broken() -> LLMEngine:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        EngineLoop.built_on_its_thread(broken)
    loop = EngineLoop.built_on_its_thread(lambda: LLMEngine(model=MODEL))
    thread = loop._thread
    loop.stop()  # never started: its waiting thread ends
    assert not thread.is_alive() and not loop.alive


def test_a_command_its_waiter_cancelled_leaves_the_loop_running(loop: EngineLoop) -> None:
    """asyncio.wrap_future cancels a pending future when its task is cancelled (a client
    gone, the server stopping); the engine thread must answer the rest as before."""
    done = threading.Event()
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    for _ in range(8):  # steps to wait behind, so that a cancel comes before the answer
        loop.submit([1, 2, 3], params, lambda out: done.set() if out.finished else None)
    cancelled = [f for f in (loop.snapshot() for _ in range(20)) if f.cancel()]
    assert cancelled, "every snapshot was answered before its cancel"
    loop.update_knobs({"max_num_seqs": 4}).cancel()  # (may lose the race: either way)
    loop.snapshot().result(TIMEOUT)  # answered after the change: the inbox is in order
    assert loop.knobs.max_num_seqs == 4  # applied all the same: the request was made
    assert done.wait(TIMEOUT) and loop.alive
