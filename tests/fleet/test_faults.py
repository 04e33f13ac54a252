"""A replica killed under load: its requests in flight end with 503 and its stream with an
error event (never a hang), the other replica keeps serving, Ray Serve starts a replacement in
its slot and the fleet's status shows it. Then a replica whose engine fails: its health check
fails and Ray Serve replaces it too."""

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from browser import CHROMIUM, VIEWPORT, WAIT_MS, chromium, dashboard
from fleet_checks import MODEL, live_rows, wait_for
from playwright.sync_api import expect
from sqlalchemy import create_engine, text
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.slow


@dataclass
class Stream:
    """One streamed completion: its HTTP status, the session that served it (from the first
    chunk's id) and every SSE data line; `started` is set at the first chunk or the end."""

    status: int = 0
    session: str = ""
    data: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)


def streamed(url: str, max_tokens: int) -> tuple[Stream, threading.Thread]:
    """Start a streamed completion in a thread; its Stream fills as the chunks come."""
    stream = Stream()

    def run() -> None:
        body = {
            "model": MODEL,
            "prompt": "token " * 8,
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        try:
            with (
                httpx.Client(base_url=url, timeout=120) as c,
                c.stream("POST", "/v1/completions", json={**body, "stream": True}) as reply,
            ):
                stream.status = reply.status_code
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        stream.data.append(line.removeprefix("data: "))
                        if len(stream.data) == 1:  # the id names the serving engine's session
                            stream.session = json.loads(stream.data[0])["id"].split("-")[1]
                            stream.started.set()
        finally:
            stream.started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return stream, thread


@dataclass
class Killed:
    victim: dict[str, Any]
    survivor: dict[str, Any]
    replies: list[httpx.Response]
    stream: Stream  # served by the victim, streaming when it died
    telemetry: ClientConnection  # /ws/telemetry?replica=all, opened before the kill
    kill_t: float


@pytest.fixture(scope="module")
def killed(fleet: Any) -> Iterator[Killed]:
    """A long streamed completion, whose replica is the victim, then eight completions
    round-robin over both replicas; the victim SIGKILLed while it streams and runs some of
    the eight; every reply."""
    client = httpx.Client(base_url=fleet.url, timeout=120)
    rows = wait_for(lambda: len(live_rows(client)) == 2 and live_rows(client), "2 replicas")
    client.patch("/fleet/knobs", json={"routing_policy": "round_robin"})

    def one(i: int) -> httpx.Response:
        body = {"model": MODEL, "prompt": "token " * 8, "max_tokens": 120, "ignore_eos": True}
        with httpx.Client(base_url=fleet.url, timeout=300) as c:
            return c.post("/v1/completions", json=body)

    telemetry = connect(fleet.url.replace("http", "ws") + "/ws/telemetry?replica=all&fields=t")
    stream, thread = streamed(fleet.url, max_tokens=900)  # far longer than the test's wait
    assert stream.started.wait(120) and stream.session, stream
    (victim,) = [r for r in rows if r["session"] == stream.session]
    (survivor,) = [r for r in rows if r["session"] != stream.session]
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        victim_busy = f"/replicas/{victim['replica']}/api/status"

        def busy() -> bool:  # the stream and at least one of the eight
            queue = client.get(victim_busy).json()["queue"]
            return bool(queue["running"] + queue["waiting"] >= 2)

        wait_for(busy, "victim busy")
        os.kill(fleet.replicas()[victim["replica"]]["pid"], signal.SIGKILL)
        kill_t = time.time()
        replies = [f.result() for f in futures]
    thread.join(150)
    assert not thread.is_alive(), "the stream of the killed replica hangs"
    yield Killed(victim, survivor, replies, stream, telemetry, kill_t)
    telemetry.close()
    client.close()


def test_a_replica_killed_mid_load(client: httpx.Client, fleet: Any, killed: Killed) -> None:
    victim, survivor, replies = killed.victim, killed.survivor, killed.replies
    codes = sorted(r.status_code for r in replies)
    assert set(codes) <= {200, 503}, codes
    failed = [r.json() for r in replies if r.status_code == 503]
    assert failed, "the killed replica had requests in flight"
    assert all(f["replica_unavailable"] and "died" in f["error"]["message"] for f in failed)
    served = [r.json()["id"].split("-")[1] for r in replies if r.status_code == 200]
    assert survivor["session"] in served  # the other replica kept serving

    status = wait_for(lambda: replaced(client, victim["slot"], victim["replica"]), "a replacement")
    assert status["totals"]["restarts"] == 1 and status["totals"]["replicas"] == 2
    assert len(status["replicas"]) == 2  # a row per slot: the replacement took the victim's
    reply = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4})
    assert reply.status_code == 200

    # the survivor's recording lost nothing: every step it ran, no gap; tagged with its replica
    session = {"s": survivor["session"]}
    steps = client.get(f"/replicas/{survivor['replica']}/api/status").json()["loop"]["steps"]
    with create_engine(f"sqlite:///{fleet.db}").connect() as conn:

        def recorded() -> Any:
            query = "select count(*), min(step), max(step) from steps where session_id = :s"
            row = conn.execute(text(query), session).one()
            conn.rollback()  # a fresh snapshot next time
            return row if row[0] >= steps else None

        count, first, last = wait_for(recorded, "the survivor's steps in the database")
        assert count == last - first + 1
        tags = conn.execute(
            text("select replica, fleet_run from sessions where id = :s"), session
        ).one()
    assert tuple(tags) == (survivor["replica"], fleet.fleet_run)


def replaced(client: httpx.Client, slot: int, replica: str) -> dict[str, Any] | None:
    """The fleet's status once `replica`, of `slot`, is replaced and every replica serves."""
    status: dict[str, Any] = client.get("/fleet/status").json()
    (row,) = [r for r in status["replicas"] if r["slot"] == slot]
    if row["previous"][-1:] == [replica] and all(r["health"] == "ok" for r in status["replicas"]):
        return status
    return None


def test_a_stream_on_the_killed_replica_ends_with_an_error_event(killed: Killed) -> None:
    """Its tokens, then one OpenAI-style error event, then the end of the stream."""
    stream = killed.stream
    assert stream.status == 200 and len(stream.data) > 2, stream
    last = json.loads(stream.data[-1])
    assert last["replica_unavailable"] and "died" in last["error"]["message"], last
    assert all("choices" in json.loads(d) for d in stream.data[:-1])  # no [DONE]: it failed


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")
def test_the_fleet_page_shows_the_restart(
    client: httpx.Client, fleet: Any, killed: Killed, tmp_path: Path
) -> None:
    """A row per slot: the replacement's, naming the killed replica it replaced; one restart."""
    victim = killed.victim
    status = wait_for(lambda: replaced(client, victim["slot"], victim["replica"]), "a replacement")
    with dashboard(fleet.url, tmp_path / "streamlit.log") as url, chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url + "/fleet")
        table = page.locator('[data-testid="stTable"]')
        expect(table).to_contain_text(victim["replica"], timeout=3 * WAIT_MS)
        for row in status["replicas"]:
            expect(table).to_contain_text(row["replica"], timeout=WAIT_MS)
        expect(table.locator("tbody tr")).to_have_count(2, timeout=WAIT_MS)
        restarts = page.locator('[data-testid="stMetric"]', has_text="restarts")
        expect(restarts).to_contain_text("1", timeout=WAIT_MS)


def test_the_fleet_telemetry_stream_outlives_a_dead_replica(fleet: Any, killed: Killed) -> None:
    """The stream of all replicas, open across the kill, still brings the survivor's steps."""
    survivor = killed.survivor["replica"]
    with httpx.Client(base_url=fleet.url, timeout=120) as c:
        c.patch("/fleet/knobs", json={"routing_policy": "least_work"})
        for _ in range(1000):
            c.post("/v1/completions", json={"model": MODEL, "prompt": "y", "max_tokens": 2})
            record = json.loads(killed.telemetry.recv(timeout=60))
            if record["replica"] == survivor and record["t"] > killed.kill_t:
                break
        else:
            raise AssertionError("no step of the survivor after the kill")


def test_a_failed_engine_fails_the_health_check_and_ray_serve_restarts_it(
    client: httpx.Client, killed: Killed
) -> None:
    """One replica's engine loop dies (its step raises, as on a broken accelerator) while its
    process lives on: its `check_health` raises, Ray Serve replaces it in its slot."""
    slot = killed.victim["slot"]
    status = wait_for(lambda: replaced(client, slot, killed.victim["replica"]), "a replacement")
    (row,) = [r for r in status["replicas"] if r["slot"] == slot]
    failing = row["replica"]

    def break_engine(_: Any) -> None:  # runs in the replica's process (pickled by value)
        from ray import serve

        from server.state import state_of

        def broken() -> None:
            raise RuntimeError("the accelerator caught fire")

        replica = serve.get_replica_context().servable_object
        state_of(replica.app).engine_loop.engine.step = broken

    ray.get(replica_actor(failing).__ray_call__.remote(break_engine))
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4}
    reply = client.post(f"/replicas/{failing}/v1/completions", json=body)
    assert reply.status_code == 503 and "caught fire" in reply.json()["error"]["message"]

    status = wait_for(lambda: replaced(client, slot, failing), "Ray Serve to replace it")
    assert len(status["replicas"]) == 2 and status["totals"]["restarts"] == 2
    (row,) = [r for r in status["replicas"] if r["slot"] == slot]
    assert row["restarts"] == 2 and row["previous"] == [killed.victim["replica"], failing]
    assert client.post("/v1/completions", json=body).status_code == 200


def replica_actor(replica: str) -> Any:
    """The Ray actor of Ray Serve's replica `replica`."""
    (actor,) = [
        a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(replica)
    ]
    return ray.get_actor(actor["name"], namespace=actor["namespace"])
