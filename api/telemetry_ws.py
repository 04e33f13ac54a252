"""WS /ws/telemetry: one JSON StepTelemetry per step, through a bounded per-client buffer.

Query: `every=N` keeps steps whose number is a multiple of N; `fields=a,b` keeps those
top-level fields (plus `step`). When a slow client's buffer overflowed, the next message it
gets carries `dropped`: how many steps were lost for it since the previous message. While
the session recorder runs, each message carries `recorder` {ok, dropped, pending}: whether
the database takes writes, steps the recorder dropped so far, steps waiting to be written.
`bundle=1` sends the steps ready at once as one JSON array per message instead (the
dashboard's choice: one send per burst rather than one per step). All clients share one bus
subscription and one encoding per step and selection (server/telemetry_fanout.py); messages
leave in bursts at most every 50 ms.
"""

import asyncio
import json
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.datastructures import QueryParams

from engine.telemetry import StepTelemetry
from server.state import state_of
from server.telemetry_fanout import ClientQueue, TelemetryFanout, TooManyClients

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


def parse_bundle(query: QueryParams) -> bool:
    """`bundle`: 0 or 1 (default 0); ValueError names the parameter."""
    raw = query.get("bundle", "0")
    if raw not in ("0", "1"):
        raise ValueError(f"bundle: expected 0 or 1, got {raw!r}")
    return raw == "1"


def fanout(app: Any) -> TelemetryFanout:
    """The app's one TelemetryFanout, made on first use."""
    state = state_of(app)
    if state.telemetry_fanout is None:
        recorder = state.recorder
        state.telemetry_fanout = TelemetryFanout(
            state.engine_loop.bus,
            state.settings.ws_buffer,
            recorder.brief if recorder is not None else None,
        )
    return state.telemetry_fanout


async def _send(ws: WebSocket, client: ClientQueue) -> None:
    while True:
        for text in await client.take():
            await ws.send_text(text)


async def _until_closed(ws: WebSocket) -> None:
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


@router.websocket("/ws/telemetry")
async def telemetry(ws: WebSocket) -> None:
    """One StepTelemetry per step (`every`, `fields`, `bundle` in the query)."""
    await ws.accept()
    try:
        every, fields = parse_query(ws.query_params)
        bundle = parse_bundle(ws.query_params)
    except ValueError as exc:
        await ws.send_text(json.dumps({"error": str(exc)}))
        await ws.close(code=1008)
        return
    hub = fanout(ws.app)
    try:
        client = hub.attach(every, fields, bundle)
    except TooManyClients as exc:
        await ws.send_text(json.dumps({"error": str(exc)}))
        await ws.close(code=1013)  # try again later
        return
    tasks = {asyncio.create_task(_send(ws, client)), asyncio.create_task(_until_closed(ws))}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hub.detach(client)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
