"""Expert placement over HTTP: on one process (refused) and on 2 real ranks (rebalanced)."""

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from api_servers import MODEL, TIMEOUT, Served, serve, stop, telemetry_ws, wait_for, wait_idle
from prometheus_client.parser import text_string_to_metric_families

from server.settings import ServerSettings


def test_one_process_has_nothing_to_rebalance(served: Served) -> None:
    info = httpx.get(served.url + "/api/experts").json()
    assert info["ep_size"] == 1 and info["mode"] == "modeled"
    assert info["placement"][0] == [list(range(8))]
    resp = httpx.post(served.url + "/api/experts/rebalance", json={"window": 8})
    assert resp.status_code == 409
    assert "nothing to rebalance" in resp.json()["error"]["message"]


def test_auto_rebalancing_is_refused_without_expert_parallel(served: Served) -> None:
    resp = httpx.patch(served.url + "/api/knobs", json={"eplb_interval_steps": 8})
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["param"] == "eplb_interval_steps" and "ep_size" in error["message"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"window": 0}, "window"),
        ({"replicas": -1}, "replicas"),
        ({"window": "8"}, "window"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_rebalance_bodies_name_the_field(served: Served, body: dict, field: str) -> None:
    resp = httpx.post(served.url + "/api/experts/rebalance", json=body)
    assert resp.status_code == 422
    assert field in resp.json()["error"]["message"]


@pytest.fixture(scope="module")
def ranks2() -> Iterator[Served]:
    s = serve(ServerSettings(model_name=MODEL), ep_size=2, ep_distributed=True, router_skew=1.5)
    yield s
    stop(s)


@pytest.mark.slow
def test_two_ranks_serve_rebalance_and_report_a_dead_rank(ranks2: Served) -> None:
    client = openai.OpenAI(base_url=ranks2.url + "/v1", api_key="unused", max_retries=0)
    out = client.completions.create(model=MODEL, prompt="experts", max_tokens=4, temperature=0)
    assert out.usage.completion_tokens == 4
    before = httpx.get(ranks2.url + "/api/experts").json()
    assert before["mode"] == "measured" and before["version"] == 1
    for prompt in ("a mixture", "of experts", "on two ranks"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=8)
    wait_idle(ranks2.loop)  # the next step is the one after the rebalance
    with telemetry_ws(ranks2) as (ws, _):
        resp = httpx.post(
            ranks2.url + "/api/experts/rebalance", json={"window": 256, "replicas": 2}, timeout=30
        )
        assert resp.status_code == 200, resp.text
        summary = resp.json()
        assert summary["imbalance_after"] < summary["imbalance_before"]
        assert summary["placement_version"] == 2 and summary["moved_bytes"] > 0
        step = json.loads(ws.recv(timeout=TIMEOUT))
        assert step["knob_changes"][-1]["changes"]["expert_placement"] == [1, 2]
        assert step["a2a"]["mode"] == "measured" and step["a2a"]["placement_version"] == 2
    after = httpx.get(ranks2.url + "/api/experts").json()
    assert after["version"] == 2 and after["placement"] == summary["placement"]
    history = httpx.get(ranks2.url + "/api/knobs/history").json()["changes"]
    assert history[-1]["origin"] == "api" and "expert_placement" in history[-1]["changes"]
    again = client.completions.create(model=MODEL, prompt="experts", max_tokens=4, temperature=0)
    assert again.choices[0].text == out.choices[0].text

    moved = {name: 0.0 for name in ("a2a_bytes_total", "ep_gather_bytes_total")}
    for family in text_string_to_metric_families(httpx.get(ranks2.url + "/metrics").text):
        for sample in family.samples:
            name = sample.name.removeprefix("moescope:")
            if name in moved:
                assert {sample.labels["src"], sample.labels["dst"]} <= {"0", "1"}
                moved[name] += sample.value
    assert min(moved.values()) > 0

    ranks2.loop.engine.ranks.procs[0].kill()
    wait_for(lambda: not ranks2.loop.alive, what="the loop to notice the dead rank")
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model=MODEL, prompt="experts", max_tokens=4)
    assert info.value.status_code == 503 and "rank 1" in info.value.message
    status = httpx.get(ranks2.url + "/api/status").json()
    assert status["loop"]["alive"] is False and "rank 1" in status["loop"]["error"]
    assert status["parallel"]["mode"] == "measured" and "rank 1" in status["parallel"]["failure"]
    assert status["parallel"]["placement_version"] == 2
