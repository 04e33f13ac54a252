"""A replica killed under load: its requests in flight end with 503 (never a hang), the other
replica keeps serving, Ray Serve starts a replacement and the fleet's status shows it."""

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import CHROMIUM, VIEWPORT, WAIT_MS, chromium, dashboard
from fleet_checks import MODEL, live_rows, wait_for
from playwright.sync_api import expect
from sqlalchemy import create_engine, text
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.slow


@dataclass
class Killed:
    victim: dict[str, Any]
    survivor: dict[str, Any]
    replies: list[httpx.Response]
    telemetry: ClientConnection  # /ws/telemetry?replica=all, opened before the kill
    kill_t: float


@pytest.fixture(scope="module")
def killed(fleet: Any) -> Iterator[Killed]:
    """Eight long completions round-robin over both replicas; one replica SIGKILLed while
    it runs some of them; every reply."""
    client = httpx.Client(base_url=fleet.url, timeout=120)
    rows = wait_for(lambda: len(live_rows(client)) == 2 and live_rows(client), "2 replicas")
    victim, survivor = rows[0], rows[1]
    client.patch("/fleet/knobs", json={"routing_policy": "round_robin"})

    def one(i: int) -> httpx.Response:
        body = {"model": MODEL, "prompt": "token " * 8, "max_tokens": 120, "ignore_eos": True}
        with httpx.Client(base_url=fleet.url, timeout=300) as c:
            return c.post("/v1/completions", json=body)

    telemetry = connect(fleet.url.replace("http", "ws") + "/ws/telemetry?replica=all&fields=t")
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        victim_busy = f"/replicas/{victim['replica']}/api/status"
        wait_for(lambda: client.get(victim_busy).json()["queue"]["running"] > 0, "victim busy")
        os.kill(fleet.replicas()[victim["replica"]]["pid"], signal.SIGKILL)
        kill_t = time.time()
        replies = [f.result() for f in futures]
    yield Killed(victim, survivor, replies, telemetry, kill_t)
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

    def replaced() -> dict[str, Any] | None:
        status = client.get("/fleet/status").json()
        health = {r["replica"]: r["health"] for r in status["replicas"]}
        ok = [r for r, h in health.items() if h == "ok"]
        if health.get(victim["replica"]) == "dead" and len(ok) == 2:
            return status
        return None

    status = wait_for(replaced, "Ray Serve to replace the killed replica")
    assert status["totals"]["restarts"] == 1 and status["totals"]["replicas"] == 2
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


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")
def test_the_fleet_page_shows_the_restart(
    client: httpx.Client, fleet: Any, killed: Killed, tmp_path: Path
) -> None:
    """The dead replica's row, its replacement's, one restart."""

    def restarted() -> dict[str, Any] | None:
        status: dict[str, Any] = client.get("/fleet/status").json()
        return status if status["totals"]["restarts"] == 1 else None

    status = wait_for(restarted, "the killed replica marked dead")
    dead = [r["replica"] for r in status["replicas"] if r["health"] == "dead"]
    assert dead == [killed.victim["replica"]]
    with dashboard(fleet.url, tmp_path / "streamlit.log") as url, chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url + "/fleet")
        table = page.locator('[data-testid="stTable"]')
        expect(table).to_contain_text(dead[0], timeout=3 * WAIT_MS)
        for row in status["replicas"]:
            expect(table).to_contain_text(row["replica"], timeout=WAIT_MS)
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
