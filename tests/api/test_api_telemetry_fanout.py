"""TelemetryFanout: one encoding per step and selection, shared by clients, off the engine
thread; per-client decimation, bundles and drop counts."""

import asyncio
import json
import threading
from typing import Any

import pytest
from api_servers import TIMEOUT

import server.telemetry_fanout as fanout_module
from engine.bus import TelemetryBus
from server.telemetry_fanout import TelemetryFanout, lost_steps, with_dropped


def _record(step: int) -> dict[str, Any]:
    return {"step": step, "kv": {"used": step}, "queue": {"running": 1}, "t": 1.5}


def _publish_from_a_thread(bus: TelemetryBus, steps: range) -> str:
    """Publish like the engine loop does, on another thread; returns that thread's name."""
    thread = threading.Thread(
        target=lambda: [bus.publish(_record(s)) for s in steps], name="engine"
    )
    thread.start()
    thread.join()
    return thread.name


async def _take(client: Any, n: int | None = None) -> list[str]:
    """What the client's queue gives, until there are `n` messages when given."""
    out = await asyncio.wait_for(client.take(), TIMEOUT)
    while n is not None and len(out) < n:
        out += await asyncio.wait_for(client.take(), TIMEOUT)
    return out


def test_each_step_is_encoded_once_per_selection_off_the_engine_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[tuple[str, ...] | None, str]] = []
    encode = fanout_module.encode

    def counting(record: dict[str, Any], fields: Any, brief: Any) -> str:
        calls.append((fields, threading.current_thread().name))
        return encode(record, fields, brief)

    monkeypatch.setattr(fanout_module, "encode", counting)

    async def run() -> None:
        bus = TelemetryBus()
        hub = TelemetryFanout(bus, maxlen=64, brief=lambda: {"ok": True}, batch_s=0.001)
        full = [hub.attach() for _ in range(3)]
        halves = hub.attach(every=2)
        kv = hub.attach(fields=["step", "kv"])
        engine = await asyncio.to_thread(_publish_from_a_thread, bus, range(4))
        got = [await _take(c, n) for c, n in zip((*full, halves, kv), (4, 4, 4, 2, 4), strict=True)]
        assert [len(g) for g in got] == [4, 4, 4, 2, 4]
        assert all(a is b for a, b in zip(got[0], got[1], strict=True))  # the same text
        assert all(a is b for a, b in zip(got[0][::2], got[3], strict=True))
        assert [json.loads(t) for t in got[0]] == [
            {**_record(s), "recorder": {"ok": True}} for s in range(4)
        ]
        assert [json.loads(t) for t in got[4]] == [{"step": s, "kv": {"used": s}} for s in range(4)]
        assert sorted(f is None for f, _ in calls) == [False] * 4 + [True] * 4
        assert engine not in {name for _, name in calls}
        for c in (*full, halves, kv):
            hub.detach(c)
        assert bus.num_subscribers == 0

    asyncio.run(run())


def test_bundles_and_drops_counted_for_each_clients_decimation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def run() -> None:
        bus = TelemetryBus()
        hub = TelemetryFanout(bus, maxlen=4, batch_s=0.001)
        monkeypatch.setattr(fanout_module, "BUS_BUFFER", 4)
        every1 = hub.attach()
        every3 = hub.attach(every=3, bundle=True)
        for step in range(10):  # the pump has not run: the bus keeps steps 6..9, drops 6
            bus.publish(_record(step))
        plain = await _take(every1)
        (bundle,) = await _take(every3)
        assert [json.loads(t)["step"] for t in plain] == [6, 7, 8, 9]
        assert json.loads(plain[0])["dropped"] == 6
        assert [f["step"] for f in json.loads(bundle)] == [6, 9]
        assert json.loads(bundle)[0]["dropped"] == 2  # steps 0 and 3 were lost for it
        hub.detach(every1)
        hub.detach(every3)

    asyncio.run(run())


def test_a_client_that_falls_behind_drops_its_oldest_but_keeps_a_whole_burst() -> None:
    async def run() -> None:
        hub = TelemetryFanout(TelemetryBus(), maxlen=3)
        client = hub.attach()
        hub.deliver([_record(s) for s in range(5)])  # one burst larger than the queue
        assert [json.loads(t) for t in await _take(client)] == [_record(s) for s in range(5)]
        hub.deliver([_record(s) for s in range(5, 8)])
        hub.deliver([_record(s) for s in range(8, 10)])  # not taken in between
        texts = await _take(client)
        assert [json.loads(t)["step"] for t in texts] == [7, 8, 9]
        assert json.loads(texts[0])["dropped"] == 2 and "dropped" not in json.loads(texts[1])
        hub.detach(client)

    asyncio.run(run())


def test_lost_steps_and_dropped_splice() -> None:
    assert lost_steps(10, 4, 1) == 4  # steps 6..9
    assert lost_steps(10, 4, 3) == 2  # 6 and 9
    assert lost_steps(10, 7, 3) == 3  # 3, 6, 9
    assert lost_steps(1, 1, 5) == 1  # step 0
    assert json.loads(with_dropped('{"step":3}', 2)) == {"step": 3, "dropped": 2}
