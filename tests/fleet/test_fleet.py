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


def test_sessions_grouped_by_fleet_run_and_tagged_by_replica(
    client: httpx.Client, fleet: Any
) -> None:
    rows = live_rows(client)
    listing = client.get("/fleet/sessions")
    assert listing.status_code == 200, listing.text
    assert listing.json()["fleet_run"] == fleet.fleet_run
    (run,) = listing.json()["runs"]  # this module's database holds one fleet run
    assert run["fleet_run"] == fleet.fleet_run
    assert run["replicas"] == sorted(r["replica"] for r in rows)
    owner = {s["id"]: s["replica"] for s in run["sessions"]}
    for row in rows:  # each replica's recording is its engine's session, tagged with it
        assert owner[row["session"]] == row["replica"]
    one = rows[0]["replica"]
    mine = client.get("/fleet/sessions", params={"replica": one}).json()["runs"]
    assert {s["replica"] for r in mine for s in r["sessions"]} == {one}
    other = client.get("/fleet/sessions", params={"fleet_run": "fleet-none"}).json()
    assert other["runs"] == []


def test_the_autopilot_runs_on_the_replica_it_is_started_on(client: httpx.Client) -> None:
    rows = live_rows(client)
    on, off = rows[0]["replica"], rows[1]["replica"]
    before = client.get("/api/autopilot").json()["replicas"]
    assert before[on]["state"] == before[off]["state"] == "off"
    reply = client.put(f"/api/autopilot?replica={on}", json={"enabled": True, "interval_s": 0.2})
    assert reply.status_code == 200, reply.text
    assert list(reply.json()["replicas"]) == [on]
    try:

        def ticked() -> dict[str, Any] | None:
            now: dict[str, Any] = client.get(f"/api/autopilot?replica={on}").json()
            return now if now["ticks"] >= before[on]["ticks"] + 3 else None

        mine = wait_for(ticked, "the started autopilot's ticks")
        assert mine["settings"]["enabled"] and mine["state"] != "off"
        theirs = client.get(f"/replicas/{off}/api/autopilot").json()
        assert theirs["state"] == "off" and not theirs["settings"]["enabled"]
        assert theirs["ticks"] == before[off]["ticks"]
        bad = client.put("/api/autopilot", json={"interval_s": 0})
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "interval_s"
    finally:
        stopped = client.put("/api/autopilot", json={"enabled": False})  # all replicas
    assert stopped.status_code == 200 and sorted(stopped.json()["replicas"]) == sorted([on, off])
    assert all(a["state"] == "off" for a in stopped.json()["replicas"].values())


def test_replay_rerun_and_whatif_of_one_replicas_session(client: httpx.Client, fleet: Any) -> None:
    """A replica's recorded session replayed through the ingress, rerun on that replica's
    engine (a new session tagged with it), and compared in that replica's twin (or refused
    there, by the twin's own check, when its few steps cannot predict the candidate)."""
    row = live_rows(client)[1]
    rid, sid = row["replica"], row["session"]
    body = {"model": MODEL, "prompt": "replay", "max_tokens": 24, "ignore_eos": True}
    for _ in range(3):  # requests to this replica's session: steps to replay, a trace to rerun
        assert client.post(f"/replicas/{rid}/v1/completions", json=body).status_code == 200
    recorded = wait_for(
        lambda: (n := client.get(f"/api/sessions/{sid}").json()["requests"]) >= 3 and n,
        "the requests recorded",
    )
    ws_url = fleet.url.replace("http", "ws")
    with connect(f"{ws_url}/ws/replay/{sid}?replica={rid}&speed=0&fields=step") as ws:
        steps = []
        while "replay" not in (message := json.loads(ws.recv(timeout=60))):
            steps.append(message["step"])
    assert message["replay"]["state"] == "ended" and len(steps) >= 8
    assert steps == sorted(set(steps))

    reply = client.post(f"/api/sessions/{sid}/rerun?replica={rid}&speed=1000")
    assert reply.status_code == 202, reply.text
    rerun = reply.json()
    assert rerun["parent"] == sid and rerun["requests"] >= recorded

    def rerun_done() -> dict[str, Any] | None:
        """The new session once its rerun ended (404 until the recorder wrote its row; the
        progress is in the memory of the replica that runs it)."""
        reply = client.get(f"/replicas/{rid}/api/sessions/{rerun['session']}")
        now: dict[str, Any] = reply.json()
        return now if reply.status_code == 200 and now["rerun"]["done"] else None

    done = wait_for(rerun_done, "the rerun on the replica")
    assert done["rerun"]["finished"] == rerun["requests"] and done["parent"] == sid
    assert (done["replica"], done["fleet_run"]) == (rid, fleet.fleet_run)
    listed = client.get("/fleet/sessions", params={"replica": rid}).json()["runs"][0]
    assert {s["id"]: s["parent"] for s in listed["sessions"]}[rerun["session"]] == sid

    body = {"knobs": {"max_num_seqs": 4}, "source": sid, "horizon_s": 5}
    compared = client.post(f"/api/whatif?replica={rid}", json=body)
    if compared.status_code == 422:
        # the replica's twin simulated its session but refused: its simulated batches outgrew
        # the few recorded ones (which steps the replica batched together is up to timing)
        error = compared.json()["error"]
        assert error["param"] == "knobs" and "simulated steps lie far beyond" in error["message"]
        return
    assert compared.status_code == 200, compared.text
    assert compared.json()["source"] == sid
    assert compared.json()["current"] and compared.json()["candidate"]
