"""WS /ws/telemetry: one JSON StepTelemetry per step, through a bounded per-client buffer.

Query: `every=N` keeps steps whose number is a multiple of N; `fields=a,b` keeps those
top-level fields (plus `step`). When a slow client's buffer overflowed, the next message it
gets carries `dropped`: how many steps were lost for it since the previous message. While
the session recorder runs, each message carries `recorder` {ok, dropped, pending}: whether
the database takes writes, steps the recorder dropped so far, steps waiting to be written.
"""

import asyncio
import json
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.datastructures import QueryParams

from engine.bus import Subscription
from engine.loop import EngineLoop
from engine.telemetry import StepTelemetry
from storage import Recorder

router = APIRouter()
EXTRA_FIELDS = ("recorder",)


def parse_query(query: QueryParams) -> tuple[int, list[str] | None]:
    """`every` (1..100000) and the `fields` list; ValueError names the bad parameter."""
    raw = query.get("every", "1")
    try:
        every = int(raw)
    except ValueError:
        raise ValueError(f"every: expected an integer >= 1, got {raw!r}") from None
    if not 1 <= every <= 100_000:
        raise ValueError(f"every: must be in [1, 100000], got {every}")
    fields = query.get("fields")
    if not fields:
        return every, None
    names = [f.strip() for f in fields.split(",") if f.strip()]
    known = [*StepTelemetry.model_fields, *EXTRA_FIELDS]
    unknown = [f for f in names if f not in known]
    if unknown:
        raise ValueError(f"fields: unknown field(s) {unknown}; known: {', '.join(known)}")
    return every, ["step", *(f for f in names if f != "step")]


async def _send(ws: WebSocket, sub: Subscription, wake: asyncio.Event,
                fields: list[str] | None, recorder: Recorder | None) -> None:
    brief = recorder.brief if recorder is not None and (not fields or "recorder" in fields) \
        else None
    while True:
        records, dropped = sub.drain()
        if not records:
            wake.clear()
            records, dropped = sub.drain()
            if not records:
                await wake.wait()
                continue
        for i, record in enumerate(records):
            msg: dict[str, Any] = {k: record[k] for k in fields if k in record} if fields \
                else record
            if brief is not None:
                msg = {**msg, "recorder": brief()}
            if i == 0 and dropped:
                msg = {**msg, "dropped": dropped}
            await ws.send_text(json.dumps(msg))


async def _until_closed(ws: WebSocket) -> None:
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


@router.websocket("/ws/telemetry")
async def telemetry(ws: WebSocket) -> None:
    await ws.accept()
    try:
        every, fields = parse_query(ws.query_params)
    except ValueError as exc:
        await ws.send_text(json.dumps({"error": str(exc)}))
        await ws.close(code=1008)
        return
    loop: EngineLoop = ws.app.state.loop
    aloop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def notify() -> None:
        aloop.call_soon_threadsafe(wake.set)

    sub = loop.bus.subscribe(ws.app.state.settings.ws_buffer, notify, every)
    tasks = {asyncio.create_task(_send(ws, sub, wake, fields, ws.app.state.recorder)),
             asyncio.create_task(_until_closed(ws))}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.bus.unsubscribe(sub)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
