"""`make demo`'s processes for the dashboard benchmark: the server (recording into a scratch
database), the dashboard and the load, started with `moescope demo`'s own commands; the
server's knob version and engine step counters; the dashboard's CPU time."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from cli.demo import (
    HOST,
    dashboard_command,
    load_command,
    server_command,
    start_child,
    stop_child,
    wait_ready,
)
from engine.ep.ranks import free_port

EP_SIZE = 4  # the demo's modeled expert-parallel ranks
RATE = 3.0  # the demo's requests per second


class Demo:
    """The server, the dashboard and the load, each in its own process group, until exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.url = f"http://{HOST}:{free_port()}"
        self.dashboard_url = f"http://{HOST}:{free_port()}"
        self.children: dict[str, subprocess.Popen] = {}
        self.http = httpx.Client(timeout=10)  # one client: a new one costs the CPU of a call

    def __enter__(self) -> Demo:
        port = int(self.url.rsplit(":", 1)[1])
        db = ["--db", f"sqlite:///{self.tmp / 'demo.db'}"]
        self.children["server"] = start_child(
            server_command(port, ["--ep-size", str(EP_SIZE)]) + db
        )
        failure = wait_ready(self.url, self.children["server"])
        if failure is not None:
            raise RuntimeError(failure)
        dash_port = int(self.dashboard_url.rsplit(":", 1)[1])
        self.children["dashboard"] = start_child(dashboard_command(self.url, dash_port))
        self._wait_dashboard()
        self.children["load"] = start_child(load_command(self.url, RATE, 0))
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.children.values()):
            stop_child(proc)
        self.http.close()

    def _wait_dashboard(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.dashboard_url + "/_stcore/health", timeout=1).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the dashboard did not come up on {self.dashboard_url}")

    def status(self) -> dict[str, Any]:
        """GET /api/status."""
        return self.http.get(self.url + "/api/status").json()

    def session(self) -> dict[str, Any]:
        """GET /api/sessions/{id} of the session being recorded: its knobs at start, ..."""
        session = self.status()["recorder"]["main_session"]
        return self.http.get(f"{self.url}/api/sessions/{session}").json()

    def knobs(self) -> dict[str, Any]:
        """GET /api/knobs: {knobs, version, ...}."""
        return self.http.get(self.url + "/api/knobs").json()

    def accepted_at(self, version: int) -> float:
        """When the server accepted knob version `version` (its clock: time.time())."""
        changes = self.http.get(self.url + "/api/knobs/history").json()["changes"]
        (change,) = [c for c in changes if c["version"] == version]
        return float(change["t"])

    def dashboard_cpu_s(self) -> float:
        """CPU seconds so far of the dashboard (`python -m dashboard` and its streamlit)."""
        root = psutil.Process(self.children["dashboard"].pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            times = proc.cpu_times()
            total += times.user + times.system
        return total


def step_ms(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Mean engine step time (ms) between two /api/status answers: wall, and the engine
    thread's CPU."""
    b, a = before["loop"], after["loop"]
    steps = max(a["steps"] - b["steps"], 1)
    return {
        "wall": 1000 * (a["busy_s"] - b["busy_s"]) / steps,
        "cpu": 1000 * (a["busy_cpu_s"] - b["busy_cpu_s"]) / steps,
    }
