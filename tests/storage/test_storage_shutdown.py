"""How a recording server ends: a clean stop writes everything, SIGKILL leaves a readable DB."""

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from api_servers import MODEL, serve, stop
from storage_helpers import TIMEOUT, run_requests, wait_for

from engine.ep.ranks import free_port
from server.settings import ServerSettings
from storage import Store
from storage import queries as q


def _stored_steps(path: Path) -> int:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT count(*) FROM steps").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_clean_stop_writes_everything_and_ends_the_session(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'clean.db'}"
    served = serve(ServerSettings(model_name=MODEL, db_url=url))
    try:
        run_requests(served.loop, 3, 10)
    finally:
        stop(served)
    store = Store(url, create=False)
    (session,) = q.list_sessions(store)
    assert session["ended_t"] is not None and session["requests"] == 3
    assert session["steps"] == served.loop.steps  # the last batch was written at shutdown
    store.close()


@pytest.mark.slow
def test_killed_writer_leaves_a_readable_database(tmp_path: Path) -> None:
    path, port = tmp_path / "killed.db", free_port()
    url = f"sqlite:///{path}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "serve",
            "--model",
            "synthetic:tiny",
            "--port",
            str(port),
            "--kv-blocks",
            "256",
            "--max-num-seqs",
            "8",
            "--threads",
            "1",
            "--no-metrics",
            "--db",
            url,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                return httpx.get(base + "/api/status", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=120, what="the server to start")
        body = {
            "model": "synthetic:tiny",
            "prompt": [5, 6, 7],
            "max_tokens": 900,
            "ignore_eos": True,
        }
        for _ in range(2):
            threading.Thread(target=_post_ignoring_errors, args=(base, body), daemon=True).start()
        written = [0]  # the most steps seen in the database so far

        def grown() -> bool:
            """True once the steps written grew past 30 (written as the server runs)."""
            now = _stored_steps(path)
            more = written[0] >= 30 and now > written[0]
            written[0] = max(written[0], now)
            return more

        wait_for(grown, timeout=120, what="recorded steps")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store = Store(url, create=False)
    (session,) = q.list_sessions(store)
    assert session["ended_t"] is None and session["steps"] >= 30
    steps = q.steps(store, session["id"])
    assert [s["step"] for s in steps] == list(range(len(steps)))  # no holes: whole batches
    assert len(steps) >= written[0]  # what was written before the kill is all there
    store.close()


def _post_ignoring_errors(base: str, body: dict[str, object]) -> None:
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(base + "/v1/completions", json=body, timeout=120)
