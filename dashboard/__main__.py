"""`python -m dashboard --url http://127.0.0.1:8000 --port 8501`: `streamlit run` on the app."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).with_name("app.py")
# At the caller's priority: the dashboard does no work per step (the browser draws the
# charts), and what it does do, answer a click, must not wait behind the engine
NICE = 0


def command(url: str, port: int, address: str = "127.0.0.1") -> list[str]:
    """The streamlit command line that serves the dashboard for the server at `url`."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",  # a served dashboard reloads no source file
        "none",
        "--",
        "--url",
        url,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboard", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="moescope server URL")
    parser.add_argument("--port", type=int, default=8501, help="dashboard port")
    parser.add_argument("--address", default="127.0.0.1", help="dashboard bind address")
    parser.add_argument(
        "--nice",
        type=int,
        default=NICE,
        help="lower the dashboard's CPU priority by this much (default 0: as the caller)",
    )
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    try:
        return subprocess.call(command(args.url, args.port, args.address))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
