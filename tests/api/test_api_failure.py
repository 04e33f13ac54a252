"""An engine failure is a 503 with the message, never a hang or a 500."""

import httpx
from api_servers import MODEL, serve, stop, wait_for

from server.settings import ServerSettings


def test_engine_failure_is_a_503_with_the_message() -> None:
    s = serve(ServerSettings(model_name=MODEL))
    try:

        def broken() -> None:
            raise RuntimeError("the accelerator caught fire")

        s.loop.engine.step = broken  # type: ignore[method-assign]
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
        resp = httpx.post(s.url + "/v1/completions", json=body, timeout=10)
        assert resp.status_code == 503
        assert "the accelerator caught fire" in resp.json()["error"]["message"]
        wait_for(lambda: not s.loop.alive, what="the loop to stop")
        status = httpx.get(s.url + "/api/status").json()
        assert status["loop"]["alive"] is False and "caught fire" in status["loop"]["error"]
        resp = httpx.post(s.url + "/v1/completions", json={**body, "stream": True}, timeout=10)
        assert resp.status_code == 503 and "caught fire" in resp.json()["error"]["message"]
        resp = httpx.patch(s.url + "/api/knobs", json={"max_num_seqs": 4}, timeout=10)
        assert resp.status_code == 503
        assert httpx.get(s.url + "/metrics").status_code == 200
    finally:
        stop(s)
