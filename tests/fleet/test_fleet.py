"""The fleet end to end: the OpenAI client through the ingress, the routing policies, knob
changes to one replica and to all, telemetry and metrics per replica."""

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from fleet_checks import MODEL, live_rows, wait_for
from websockets.sync.client import connect

pytestmark = pytest.mark.slow


def sessions_to_replicas(client: httpx.Client) -> dict[str, str]:
    return {r["session"]: r["replica"] for r in live_rows(client)}


def served_by(client: httpx.Client, fleet: Any, policy: str, n: int) -> Counter[str]:
    """Set the routing policy, send `n` completions at once with the OpenAI client, and
    count the replica that answered each (its session is in the completion id)."""
    assert client.patch("/fleet/knobs", json={"routing_policy": policy}).status_code == 200
    oa = openai.OpenAI(base_url=fleet.url + "/v1", api_key="none", max_retries=0)

    def one(i: int) -> str:
        reply = oa.completions.create(
            model=MODEL, prompt="expert " * (5 + i), max_tokens=8, temperature=0
        )
        assert reply.choices[0].finish_reason == "length"
        return reply.id.split("-")[1]

    with ThreadPoolExecutor(n) as pool:
        sessions = list(pool.map(one, range(n)))
    owner = sessions_to_replicas(client)
    return Counter(owner[s] for s in sessions)


def test_both_replicas_serve_and_every_policy_spreads(client: httpx.Client, fleet: Any) -> None:
    assert len(wait_for(lambda: len(live_rows(client)) == 2 and live_rows(client), "2 rows")) == 2
    for policy in ("round_robin", "least_work", "power_of_two"):
        counts = served_by(client, fleet, policy, 8)
        assert sum(counts.values()) == 8
        if policy != "power_of_two":  # two random picks may be the same replica
            assert len(counts) == 2, (policy, counts)
    assert counts  # power_of_two answered too
    round_robin = served_by(client, fleet, "round_robin", 6)
    assert sorted(round_robin.values()) == [3, 3]


def test_fleet_knob_is_versioned_and_validated(client: httpx.Client) -> None:
    before = client.get("/fleet/knobs").json()
    bad = client.patch("/fleet/knobs", json={"routing_policy": "random"})
    assert bad.status_code == 422
    assert bad.json()["error"]["param"] == "routing_policy"
    unknown = client.patch("/fleet/knobs", json={"max_num_seqs": 3})
    assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "max_num_seqs"
    ok = client.patch("/fleet/knobs", json={"routing_policy": "least_work"}).json()
    assert ok["version"] == before["version"] + 1
    assert ok["knobs"] == {"routing_policy": "least_work"}
    history = client.get("/fleet/knobs/history").json()["history"]
    assert history[-1]["version"] == ok["version"]


def test_knob_change_to_one_replica_and_to_all(client: httpx.Client) -> None:
    rows = live_rows(client)
    one, other = rows[0]["replica"], rows[1]["replica"]
    versions = {r["replica"]: r["knobs_version"] for r in rows}

    reply = client.patch(f"/api/knobs?replica={one}", json={"max_num_seqs": 12})
    assert reply.status_code == 200, reply.text
    assert list(reply.json()["applied"]) == [one]
    knobs = client.get("/api/knobs").json()["replicas"]
    assert knobs[one]["knobs"]["max_num_seqs"] == 12
    assert knobs[other]["knobs"]["max_num_seqs"] == 16
    assert knobs[one]["version"] == versions[one] + 1
    assert knobs[other]["version"] == versions[other]

    reply = client.patch("/api/knobs", json={"max_num_seqs": 10})
    assert reply.status_code == 200, reply.text
    applied = reply.json()["applied"]
    assert applied == {one: versions[one] + 2, other: versions[other] + 1}
    # the same through one replica's own routes
    mine = client.get(f"/replicas/{other}/api/knobs").json()
    assert mine["knobs"]["max_num_seqs"] == 10 and mine["version"] == versions[other] + 1
    log = client.get("/fleet/knobs/history").json()["replica_changes"]
    assert log[-1]["applied"] == applied and log[-1]["changes"] == {"max_num_seqs": 10}

    refused = client.patch("/api/knobs", json={"max_num_seqs": 0})
    assert refused.status_code == 422
    assert "max_num_seqs" in json.dumps(refused.json())
    missing = client.patch("/api/knobs?replica=nope", json={"max_num_seqs": 8})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "replica"


def test_telemetry_of_all_replicas_and_of_one(client: httpx.Client, fleet: Any) -> None:
    rows = live_rows(client)
    ws_url = fleet.url.replace("http", "ws")
    oa = openai.OpenAI(base_url=fleet.url + "/v1", api_key="none", max_retries=0)

    def seen(query: str, want: set[str]) -> set[str]:
        got: set[str] = set()
        with connect(f"{ws_url}/ws/telemetry?{query}") as ws:
            for _ in range(200):
                if got >= want:
                    break
                with ThreadPoolExecutor(4) as pool:  # steps happen only under load
                    list(
                        pool.map(
                            lambda _: oa.completions.create(
                                model=MODEL, prompt="router", max_tokens=4
                            ),
                            range(4),
                        )
                    )
                record = json.loads(ws.recv(timeout=60))
                got.add(record["replica"])
                assert "step" in record and "kv" in record
        return got

    both = {r["replica"] for r in rows}
    assert seen("replica=all", both) == both
    one = rows[0]["replica"]
    assert seen(f"replica={one}", {one}) == {one}


def test_metrics_carry_the_replica_label(client: httpx.Client) -> None:
    text = client.get("/metrics").text
    for row in live_rows(client):
        assert f'replica="{row["replica"]}"' in text
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(families) == len(set(families))  # one HELP/TYPE per family


def test_fleet_rows_show_slots_latency_and_imbalance(client: httpx.Client) -> None:
    status = client.get("/fleet/status").json()
    assert status["totals"]["replicas"] == 2
    for row in status["replicas"]:
        assert row["health"] == "ok"
        assert row["finished"] > 0 and row["ttft_p90_ms"] > 0 and row["tpot_p90_ms"] > 0
        assert row["expert_imbalance"] >= 1.0
        assert row["slots"]["max"] >= 1 and row["kv"]["usable"] == 256


def test_the_browser_may_read_a_replica_through_the_ingress(client: httpx.Client) -> None:
    """The Live page's reports fetch the API from the dashboard's origin: CORS as the server."""
    replica = live_rows(client)[0]["replica"]
    headers = {"Origin": "http://dashboard.example", "Access-Control-Request-Method": "GET"}
    reply = client.get(f"/replicas/{replica}/api/status", headers={"Origin": headers["Origin"]})
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == "*"
    preflight = client.options(
        f"/replicas/{replica}/api/attribution",
        headers={**headers, "Access-Control-Request-Headers": "authorization"},
    )
    assert preflight.status_code == 200


def test_streams_and_bad_input_pass_through_the_ingress(client: httpx.Client, fleet: Any) -> None:
    oa = openai.OpenAI(base_url=fleet.url + "/v1", api_key="none", max_retries=0)
    chunks = list(
        oa.completions.create(model=MODEL, prompt="cache", max_tokens=6, stream=True, temperature=0)
    )
    assert chunks and chunks[-1].choices[0].finish_reason == "length"
    assert sum(len(c.choices[0].text) > 0 for c in chunks if c.choices) >= 1
    bad = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": -1})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "max_tokens"
    assert client.get("/replicas/nope/api/status").status_code == 404
