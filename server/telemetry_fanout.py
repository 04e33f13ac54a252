"""One bus subscription for every /ws/telemetry client, each step encoded once per selection.

The engine thread only appends each record to the fan-out's bounded bus buffer. A task on
the server's event loop drains it every `batch_s` at most, encodes each record to JSON once
per distinct `fields` selection (with the recorder's brief where selected) and hands the same
text to every client that chose it, through each client's own bounded queue. A client that
asked for bundles gets what is queued as one JSON array per message, so its cost to the
server is one send per `batch_s` rather than one per step.
"""

import asyncio
import json
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from engine.bus import Subscription, TelemetryBus

Fields = tuple[str, ...] | None
BATCH_S = 0.05
BUS_BUFFER = 4096  # steps between two drains of the shared buffer before the bus drops any
MAX_CLIENTS = 256  # websocket clients at once; each holds at most its `maxlen` steps


class TooManyClients(Exception):
    """MAX_CLIENTS are attached already."""


def encode(record: dict[str, Any], fields: Fields, brief: dict[str, Any] | None) -> str:
    """The message for `record`: the `fields` it has (all when None), plus `recorder`."""
    msg = record if fields is None else {k: record[k] for k in fields if k in record}
    if brief is not None:
        msg = {**msg, "recorder": brief}
    return json.dumps(msg, separators=(",", ":"))


def with_dropped(text: str, dropped: int) -> str:
    """An encoded message with `dropped` added as its last field."""
    return f'{text[:-1]},"dropped":{dropped}}}'


def lost_steps(first_step: int, lost: int, every: int) -> int:
    """How many of the `lost` consecutive steps just before `first_step` are multiples of
    `every` (the steps a client with that decimation would have got)."""
    return (first_step - 1) // every - (first_step - lost - 1) // every


class ClientQueue:
    """One client's queue of encoded steps: it keeps the newest `maxlen` (or the whole latest
    burst, if larger) and counts the older ones it drops."""

    def __init__(
        self, maxlen: int, every: int, fields: Fields, recorder: bool, bundle: bool = False
    ) -> None:
        self.maxlen = maxlen
        self.every = every
        self.fields = fields
        self.recorder = recorder
        self.bundle = bundle
        self.texts: deque[str] = deque()
        self.dropped = 0
        self._ready = asyncio.Event()

    def offer(self, burst: list[str]) -> None:
        self.texts.extend(burst)
        keep = max(self.maxlen, len(burst))
        while len(self.texts) > keep:
            self.texts.popleft()
            self.dropped += 1
        self._ready.set()

    async def take(self) -> list[str]:
        """The messages for everything queued (waiting for at least one): one a step, or one
        array when bundling; `dropped` is added to the first step."""
        while not self.texts:
            self._ready.clear()
            await self._ready.wait()
        texts = list(self.texts)
        self.texts.clear()
        if self.dropped:
            texts[0] = with_dropped(texts[0], self.dropped)
            self.dropped = 0
        return [f"[{','.join(texts)}]"] if self.bundle else texts


class TelemetryFanout:
    """Subscribes to `bus` while at least one client is attached; runs on the event loop."""

    def __init__(
        self,
        bus: TelemetryBus,
        maxlen: int,
        brief: Callable[[], dict[str, Any]] | None = None,
        batch_s: float = BATCH_S,
    ) -> None:
        self.bus = bus
        self.maxlen = maxlen
        self.brief = brief
        self.batch_s = batch_s
        self.clients: list[ClientQueue] = []
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def attach(
        self, every: int = 1, fields: Sequence[str] | None = None, bundle: bool = False
    ) -> ClientQueue:
        """A new client's queue; `fields` as parse_query gives them (None: everything).
        TooManyClients when MAX_CLIENTS are attached."""
        if len(self.clients) >= MAX_CLIENTS:
            raise TooManyClients(f"{MAX_CLIENTS} telemetry clients are connected: try again later")
        key = None if fields is None else tuple(fields)
        recorder = self.brief is not None and (key is None or "recorder" in key)
        client = ClientQueue(self.maxlen, every, key, recorder, bundle)
        self.clients.append(client)
        if self._task is None:
            aloop = asyncio.get_running_loop()
            self._sub = self.bus.subscribe(
                BUS_BUFFER, lambda: aloop.call_soon_threadsafe(self._wake.set)
            )
            self._task = asyncio.create_task(self._pump(self._sub))
        return client

    def detach(self, client: ClientQueue) -> None:
        if client in self.clients:
            self.clients.remove(client)
        if not self.clients and self._task is not None:
            self._task.cancel()
            self._task = None
            if self._sub is not None:
                self.bus.unsubscribe(self._sub)
                self._sub = None

    async def _pump(self, sub: Subscription) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            records, lost = sub.drain()
            self.deliver(records, lost)
            await asyncio.sleep(self.batch_s)

    def deliver(self, records: list[dict[str, Any]], lost: int = 0) -> None:
        """Encode each record once per selection and queue it for the clients that want it;
        `lost` records just before the first were dropped by the bus."""
        if not records:
            return
        if lost:
            for client in self.clients:
                client.dropped += lost_steps(records[0]["step"], lost, client.every)
        bursts: dict[int, list[str]] = {id(c): [] for c in self.clients}
        brief = self.brief if any(c.recorder for c in self.clients) else None
        for record in records:
            texts: dict[tuple[Fields, bool], str] = {}
            current = brief() if brief is not None else None
            for client in self.clients:
                if record["step"] % client.every:
                    continue
                key = (client.fields, client.recorder)
                if key not in texts:
                    texts[key] = encode(record, client.fields, current if client.recorder else None)
                bursts[id(client)].append(texts[key])
        for client in self.clients:
            if bursts[id(client)]:
                client.offer(bursts[id(client)])
