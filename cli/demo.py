"""`moescope demo`: the server on the demo model (recording on, prompts included, 4
expert-parallel ranks modeled, or `--ep N` real ones), a moderate load of real text (held-out
standard library snippets) running against it, and the dashboard.

Each child runs in its own process group, so stopping one stops what it started (streamlit,
expert-parallel ranks). If any child ends before the load has finished, the demo stops the
others and exits 1 saying which.
"""

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import NoReturn

import httpx

from cli.loadgen import HELD_OUT

# the small MoE trained on the standard library (models/train_demo.py): its experts route
# real text, so the expert views show structure rather than noise
MODEL = "demo"
HOST = "127.0.0.1"
CLI = [sys.executable, "-m", "cli.main"]


def server_command(port: int, parallel: list[str]) -> list[str]:
    """The demo's server: MODEL on HOST:`port`, `parallel` being `--ep N` or `--ep-size N`,
    keeping prompts in its recording (a rerun replays the same text)."""
    return [
        *CLI,
        "serve",
        "--model",
        MODEL,
        "--host",
        HOST,
        "--port",
        str(port),
        "--record-prompts",
        *parallel,
    ]


def dashboard_command(url: str, port: int) -> list[str]:
    """The demo's dashboard for the server at `url`, on HOST:`port`."""
    return [sys.executable, "-m", "dashboard", "--url", url, "--port", str(port)]


def load_command(url: str, rate: float, duration: float) -> list[str]:
    """The demo's load on `url`: `rate` requests a second for `duration` s (0: until stopped),
    prompts of 16 to 256 tokens of held-out standard library source (text the demo model
    never trained on, so its routing shows what it learned), outputs of 16 to 128."""
    return [
        *CLI,
        "load",
        "--url",
        url,
        "--rate",
        str(rate),
        "--duration",
        str(duration),
        "--prompt-len",
        "uniform:16:256",
        "--output-len",
        "uniform:16:128",
        "--prompts",
        HELD_OUT,
    ]


def port_in_use(host: str, port: int) -> bool:
    """Whether a server could not bind `host:port` now (bound as uvicorn does: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def port_problem(ports: dict[str, int]) -> str | None:
    """Why the demo cannot use these ports (flag -> port), or None when it can."""
    if len(set(ports.values())) < len(ports):
        return f"{' and '.join(ports)} must differ"
    for flag, port in ports.items():
        if port_in_use(HOST, port):
            return f"port {port} ({flag}) is already in use on {HOST}"
    return None


def wait_ready(
    url: str, server: subprocess.Popen, timeout_s: float = 180.0, path: str = "/api/status"
) -> str | None:
    """None once the server answers 200 on `path`; else why it did not come up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"the server exited ({_exit_status(server.returncode)}) before it came up"
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return f"the server did not come up on {url} within {timeout_s:.0f} s"


def _exit_status(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def start_child(command: list[str]) -> subprocess.Popen:
    """A child in its own process group (Ctrl-C reaches only the demo, which stops it)."""
    return subprocess.Popen(command, process_group=0)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, sig)


def stop_child(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGINT to the child's process group, then SIGKILL if it is not gone in time."""
    _signal_group(proc, signal.SIGINT)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    _signal_group(proc, signal.SIGKILL)


def _watch(children: dict[str, subprocess.Popen], poll_s: float = 0.2) -> int:
    """Wait until the load ends: 0 if it finished well, else 1 naming the child that ended."""
    while True:
        for name, proc in children.items():
            code = proc.poll()
            if code is None:
                continue
            if name == "load" and code == 0:
                return 0
            print(
                f"moescope demo: the {name} stopped unexpectedly ({_exit_status(code)}); "
                "stopping the rest",
                file=sys.stderr,
            )
            return 1
        time.sleep(poll_s)


def _interrupt(signum: int, frame: object) -> NoReturn:
    """The first SIGINT or SIGTERM stops everything; later ones are ignored, so the stopping
    finishes (`timeout` and make each pass a SIGTERM on, a person may press Ctrl-C twice)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def _banner(args: argparse.Namespace, url: str) -> str:
    return (
        f"\nmoescope demo: {MODEL} on {url}, load {args.rate} req/s (Ctrl-C stops all)\n"
        f"  dashboard  http://{HOST}:{args.dashboard_port}  <- open this\n"
        f"  telemetry  ws://{HOST}:{args.port}/ws/telemetry\n"
        f"  metrics    {url}/metrics\n"
        f"  status     {url}/api/status\n"
        f"  knobs      {url}/api/knobs  (e.g. curl -X PATCH {url}/api/knobs "
        "-H 'content-type: application/json' -d '{\"max_num_seqs\": 8}')\n"
        f"  OpenAI     {url}/v1\n"
    )


def run_demo(args: argparse.Namespace) -> int:
    """Start the server, dashboard and load, print where to look, and stop them all on Ctrl-C
    (or SIGTERM), at the end of the load, or when one of them dies."""
    problem = port_problem({"--port": args.port, "--dashboard-port": args.dashboard_port})
    if problem is not None:
        print(f"moescope demo: {problem}", file=sys.stderr)
        return 1
    url = f"http://{HOST}:{args.port}"
    parallel = ["--ep", str(args.ep)] if args.ep else ["--ep-size", str(args.ep_size)]
    children: dict[str, subprocess.Popen] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        children["server"] = start_child(server_command(args.port, parallel))
        failure = wait_ready(url, children["server"])
        if failure is not None:
            print(f"moescope demo: {failure}", file=sys.stderr)
            return 1
        children["dashboard"] = start_child(dashboard_command(url, args.dashboard_port))
        print(_banner(args, url), flush=True)
        children["load"] = start_child(load_command(url, args.rate, args.duration))
        return _watch(children)
    except KeyboardInterrupt:
        print("\nmoescope demo: stopping", file=sys.stderr)
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not strand a child
        for proc in reversed(children.values()):
            stop_child(proc)
