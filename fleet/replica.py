"""One engine replica of the fleet: the single server's whole app (`api.app.create_app`) on
its own port inside a Ray Serve replica.

The ingress reaches a replica two ways: through its Ray Serve handle, where the fleet's
request router picks the replica (`call`, `stream`: the OpenAI routes), and straight at the
replica's own server for routes about one replica (`/replicas/{id}/...`), whose address the
replica writes in the registry. Ray Serve polls `check_health` and `record_routing_stats`.
"""

import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import ray
import torch
from fastapi import APIRouter, FastAPI, Request
from ray import serve

from api.app import create_app
from api.launch import ServerThread, build_loop
from fleet.registry import registry
from server.settings import ServerSettings
from server.state import state_of
from stats import percentile

START_TIMEOUT_S = 600.0  # a busy 2-core machine builds the engine slowly
RECENT_S = 60.0  # the window of the row's latency percentiles


class EngineReplica:
    """A Ray Serve deployment class (wrapped by `fleet.app.deployments`)."""

    def __init__(
        self,
        model: str,
        engine_args: dict[str, Any],
        settings: ServerSettings,
        fleet_run: str,
    ) -> None:
        if isinstance(engine_args.get("threads"), int):
            torch.set_num_threads(engine_args["threads"])
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self.fleet_run = fleet_run
        loop = build_loop(model, **engine_args)
        self.app = create_app(loop, settings)
        self.app.include_router(_row_router(self.replica))
        recorder = state_of(self.app).recorder
        if recorder is not None:  # the app starts it: its sessions name this replica and run
            recorder.start = functools.partial(  # type: ignore[method-assign]
                recorder.start, replica=self.replica, fleet_run=fleet_run
            )
        host = ray.util.get_node_ip_address()
        self.server = ServerThread(self.app, host=host).start(START_TIMEOUT_S)
        self.url = self.server.url
        self.client = httpx.AsyncClient(base_url=self.url, timeout=None)
        ray.get(
            registry().register.remote(
                self.replica,
                _slot(context.rank),
                {
                    "url": self.url,
                    "pid": os.getpid(),
                    "node": host,
                    "session": loop.engine.session,
                    "started_t": time.time(),
                },
            )
        )

    async def call(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes, work: int
    ) -> tuple[int, dict[str, str], bytes]:
        """One request to this replica's server, answered whole. `work` is for the router."""
        reply = await self.client.request(
            method, path, params=query or None, headers=headers, content=body
        )
        return reply.status_code, _kept_headers(reply.headers), reply.content

    async def stream(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes, work: int
    ) -> AsyncIterator[Any]:
        """One request answered as it comes: first (status, headers), then the body's chunks."""
        request = self.client.build_request(
            method, path, params=query or None, headers=headers, content=body
        )
        reply = await self.client.send(request, stream=True)
        try:
            yield reply.status_code, _kept_headers(reply.headers)
            async for chunk in reply.aiter_raw():
                yield chunk
        finally:
            await reply.aclose()

    def record_routing_stats(self) -> dict[str, Any]:
        """What the router reads besides its own counts: KV headroom and the queue."""
        summary = state_of(self.app).engine_loop.summary()
        kv = summary["kv"]
        usable = kv.get("usable") or kv.get("total") or 1
        return {
            "kv_free": kv["free"] / usable,
            "waiting": summary["queue"]["waiting"],
            "running": summary["queue"]["running"],
        }

    def check_health(self) -> None:
        """Ray Serve restarts the replica when this raises (or does not answer)."""
        loop = state_of(self.app).engine_loop
        if not loop.alive:
            raise RuntimeError(f"engine loop stopped: {loop.error}")
        if not self.server.thread.is_alive():
            raise RuntimeError("the replica's HTTP server stopped")

    def __del__(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()
            state_of(self.app).engine_loop.stop()


def _slot(rank: Any) -> int:
    """The replica's rank: a `ReplicaRank`'s `rank`, or the int older Ray gives."""
    return int(getattr(rank, "rank", rank))


_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "content-encoding"})


def _kept_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}


def _row_router(replica: str) -> APIRouter:
    router = APIRouter()

    @router.get("/fleet/replica")
    async def replica_row(request: Request) -> dict[str, Any]:
        """This replica's row of the Fleet page: slots, KV, queue, latency percentiles over
        the last minute, expert imbalance, knobs version."""
        return await asyncio.to_thread(row, request.app, replica)

    return router


def row(app: FastAPI, replica: str) -> dict[str, Any]:
    state = state_of(app)
    summary = state.engine_loop.summary()
    since = time.time() - RECENT_S
    records = [r for r in list(state.window.records) if r["finished_t"] >= since]
    ttft = [r["ttft_ms"] for r in records if r["ttft_ms"] is not None]
    tpot = [
        (r["e2e_ms"] - r["ttft_ms"]) / (r["output_len"] - 1)
        for r in records
        if r["ttft_ms"] is not None and r["output_len"] > 1
    ]
    kv = summary["kv"]
    return {
        "replica": replica,
        "session": state.engine_loop.engine.session,
        "alive": summary["loop"]["alive"],
        "steps": summary["loop"]["steps"],
        "slots": {"running": summary["queue"]["running"], "max": summary["knobs"]["max_num_seqs"]},
        "kv": {"used": kv["used"], "usable": kv.get("usable", kv["total"]), "usage": kv["usage"]},
        "queue": summary["queue"],
        "ttft_p90_ms": percentile(ttft, 90),
        "tpot_p90_ms": percentile(tpot, 90),
        "finished": len(records),
        "expert_imbalance": imbalance(list(state.window.routed)),
        "knobs_version": summary["knobs_version"],
    }


def imbalance(routed: list[np.ndarray]) -> float | None:
    """Max over mean expert load of the recent steps, averaged over layers (1 = even)."""
    if not routed:
        return None
    loads = np.sum(routed, axis=0).astype(float)  # [layers, experts]
    mean = loads.mean(axis=1)
    ok = mean > 0
    if not ok.any():
        return None
    return float((loads.max(axis=1)[ok] / mean[ok]).mean())
