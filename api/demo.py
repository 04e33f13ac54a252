"""`moescope demo`: the server on synthetic:small (recording on, 4 expert-parallel ranks
modeled, or `--ep N` real ones), a moderate load running against it, and the dashboard."""

import argparse
import signal
import subprocess
import sys
import time

import httpx

MODEL = "synthetic:small"


def _wait_ready(url: str, server: subprocess.Popen, timeout_s: float = 180.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        try:
            if httpx.get(url + "/api/status", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return False


def _stop(proc: subprocess.Popen, sig: int, timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_demo(args: argparse.Namespace) -> int:
    """Start both processes, print where to look, and stop both on Ctrl-C (or at the end)."""
    host = "127.0.0.1"
    url = f"http://{host}:{args.port}"
    cli = [sys.executable, "-m", "api.cli"]
    parallel = ["--ep", str(args.ep)] if args.ep else ["--ep-size", str(args.ep_size)]
    server = subprocess.Popen([*cli, "serve", "--model", MODEL, "--host", host,
                               "--port", str(args.port), *parallel])
    load: subprocess.Popen | None = None
    dashboard: subprocess.Popen | None = None
    try:
        if not _wait_ready(url, server):
            print(f"moescope demo: the server did not come up on {url}", file=sys.stderr)
            return 1
        dashboard = subprocess.Popen([sys.executable, "-m", "dashboard", "--url", url,
                                      "--port", str(args.dashboard_port)])
        print(f"\nmoescope demo: {MODEL} on {url}, load {args.rate} req/s (Ctrl-C stops all)\n"
              f"  dashboard  http://{host}:{args.dashboard_port}  <- open this\n"
              f"  telemetry  ws://{host}:{args.port}/ws/telemetry\n"
              f"  metrics    {url}/metrics\n"
              f"  status     {url}/api/status\n"
              f"  knobs      {url}/api/knobs  (e.g. curl -X PATCH {url}/api/knobs "
              "-H 'content-type: application/json' -d '{\"max_num_seqs\": 8}')\n"
              f"  OpenAI     {url}/v1\n", flush=True)
        load = subprocess.Popen([*cli, "load", "--url", url, "--rate", str(args.rate),
                                 "--duration", str(args.duration),
                                 "--prompt-len", "uniform:16:256",
                                 "--output-len", "uniform:16:128"])
        load.wait()
    except KeyboardInterrupt:
        print("\nmoescope demo: stopping", file=sys.stderr)
    finally:
        for proc in (load, dashboard):
            if proc is not None:
                _stop(proc, signal.SIGINT)
        _stop(server, signal.SIGINT)
    return 0
