"""`torchrun --nproc-per-node 2 -m cli.main serve`: every rank from torchrun, rank 0 serves."""

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from api_servers import wait_for

from engine.ep.ranks import free_port


@pytest.mark.slow
def test_torchrun_ranks_serve_with_measured_all_to_all(tmp_path: Path) -> None:
    port = free_port()
    torchrun = Path(sys.executable).with_name("torchrun")
    log = (tmp_path / "torchrun.log").open("w")
    proc = subprocess.Popen(
        [
            str(torchrun),
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "--log-dir",  # else torchrun leaves a torchelastic_* folder in /tmp
            str(tmp_path / "ranks"),
            "-m",
            "cli.main",
            "serve",
            "--model",
            "synthetic:tiny",
            "--port",
            str(port),
            "--threads",
            "1",
            "--no-record",
            "--no-metrics",
            "--kv-blocks",
            "128",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "torchrun.log").read_text()
            try:
                return httpx.get(base + "/api/status", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=120, what="rank 0's server")
        experts = httpx.get(base + "/api/experts").json()
        assert experts["ep_size"] == 2 and experts["mode"] == "measured"
        body = {
            "model": "synthetic:tiny",
            "prompt": [5, 6, 7, 8],
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
        }
        out = httpx.post(base + "/v1/completions", json=body, timeout=60).json()
        assert out["usage"]["completion_tokens"] == 6
        status = httpx.get(base + "/api/status").json()
        assert status["engine_config"]["parallel"]["distributed"] is True
        assert status["loop"]["steps"] >= 6
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        log.close()
