"""Everything above the engine on the newer families (issue 46): tiny gpt-oss, DeepSeek-V2
(softmax group-limited routing) and DeepSeek-V3 (sigmoid, biased group choice) checkpoints, the
DeepSeek ones with a dense first layer and a latent KV cache, each served by a real server on
two modeled expert-parallel ranks that records into SQLite: the OpenAI route, step telemetry,
/api/status, placement, metrics, recording and replay, the twin (recorded and live), the
autopilot's ticks and attribution."""

import importlib
import json
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from api_servers import Served, serve, stop, telemetry_ws, wait_for, wait_idle, ws_connect
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import ClientConnection

from engine import SamplingParams
from engine.loop import EngineLoop
from engine.outputs import RequestDelta
from server.settings import ServerSettings
from server.state import state_of
from tuning.twin.cost_model import MIN_STEPS

pytestmark = pytest.mark.slow  # each family's server records a real session first

ENGINE_TESTS = Path(__file__).parents[1] / "engine"
PROMPT = "the cat sat on the mat"  # six words of the checkpoints' word-level vocabulary
REQUESTS = 12  # of the recorded load, besides the OpenAI request
MAX_TOKENS = 16


@dataclass(frozen=True)
class Family:
    checkpoint: str
    moe_layers: list[int]  # real indices: DeepSeek's first layer is a dense MLP
    groups: int  # expert groups of group-limited routing (0: none)
    topk_group: int
    kv_per_layer: int  # float32 bytes a token costs in one layer's KV cache


FAMILIES = {
    # three layers of 2 KV heads of 16, K and V
    "gpt_oss": Family("gpt_oss", [0, 1, 2], 0, 0, 2 * 2 * 16 * 4),
    # latent (kv_lora_rank 16) plus the rotated key (qk_rope_head_dim 4)
    "deepseek_v2_group": Family("deepseek_v2_group", [1, 2], 4, 2, (16 + 4) * 4),
    "deepseek_v3": Family("deepseek_v3", [1, 2], 4, 2, (16 + 4) * 4),
}


@dataclass
class Recorded:
    family: Family
    served: Served
    session: str
    completion: Any  # the OpenAI client's answer
    steps: list[dict[str, Any]]  # every step's telemetry, as the websocket sent it
    ids: list[str]  # the recorded load's requests

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(self.served.url + path, params=params, timeout=60)


def write_checkpoint(root: Path, name: str) -> Path:
    sys.path.insert(0, str(ENGINE_TESTS))
    try:
        checkpoints = importlib.import_module("hf_checkpoints")
    finally:
        sys.path.remove(str(ENGINE_TESTS))
    if name == "gpt_oss":
        return Path(checkpoints.make_gpt_oss_checkpoint(root))
    return Path(checkpoints.make_deepseek_checkpoint(root, name))


def load(loop: EngineLoop) -> list[str]:
    """REQUESTS greedy requests of distinct 12-token prompts (ids inside the checkpoints'
    128-token vocabulary), straight to the loop, until they have finished; their ids."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    futures: list[Future[str]] = []
    for i in range(REQUESTS):
        future: Future[str] = Future()

        def on_output(delta: RequestDelta, future: "Future[str]" = future) -> None:
            if delta.finished:
                future.set_result(delta.request_id)

        loop.submit([0, *range(3 + i, 14 + i)], params, on_output)
        futures.append(future)
    return [f.result(timeout=120) for f in futures]


def until_idle(ws: ClientConnection) -> list[dict[str, Any]]:
    """Telemetry records until one shows an empty engine."""
    out = []
    while True:
        msg = json.loads(ws.recv(timeout=60))
        out.append(msg)
        q = msg["queue"]
        if q["running"] == q["waiting"] == q["swapped"] == 0:
            return out


@pytest.fixture(scope="module", params=list(FAMILIES))
def recorded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Recorded]:
    """A server of the family on two modeled ranks with four batch slots, recording: one OpenAI
    completion, then REQUESTS requests at once (eight queue), watched over /ws/telemetry."""
    family = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(family.checkpoint)
    path = write_checkpoint(root, family.checkpoint)
    settings = ServerSettings(model_name=family.checkpoint, db_url=f"sqlite:///{root / 'db'}")
    served = serve(settings, model=str(path), max_num_seqs=4, ep_size=2)
    try:
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
        with telemetry_ws(served) as (ws, _):
            completion = client.completions.create(
                model=family.checkpoint,
                prompt=PROMPT,
                max_tokens=8,
                temperature=0.0,
                extra_body={"ignore_eos": True},
            )
            steps = until_idle(ws)
            ids = load(served.loop)
            wait_idle(served.loop)
            steps += until_idle(ws)
        recorder = state_of(served.app).recorder
        assert recorder is not None
        wait_for(
            lambda: recorder.flush() and recorder.written_steps == served.loop.steps,
            what="the recording",
        )
        yield Recorded(family, served, served.loop.engine.session, completion, steps, ids)
    finally:
        stop(served)


def test_the_openai_route_completes(recorded: Recorded) -> None:
    out = recorded.completion
    assert out.model == recorded.family.checkpoint
    assert out.usage.prompt_tokens == 7  # <s> and six words
    assert out.usage.completion_tokens == 8 and out.choices[0].finish_reason == "length"
    assert len(out.choices[0].text.split()) == 8  # every id decodes to one word


def test_telemetry_counts_experts_of_the_moe_layers_only(recorded: Recorded) -> None:
    family = recorded.family
    numbers = [m["step"] for m in recorded.steps]
    assert numbers == list(range(len(numbers)))  # every step, from the first
    busy = 0
    for msg in recorded.steps:
        experts, batch = msg["experts"], msg["batch"]
        tokens = batch["num_prefill_tokens"] + batch["num_decode_tokens"]
        assert experts["moe_layers"] == family.moe_layers
        assert experts["layers"] == len(experts["counts"]) == len(family.moe_layers)
        for row, dropped in zip(experts["counts"], experts["dropped"], strict=True):
            assert sum(row) + dropped == tokens * experts["top_k"]
        if family.groups:  # each token picks topk_group of the groups, in every MoE layer
            assert len(experts["groups"]) == len(family.moe_layers)
            for row in experts["groups"]:
                assert len(row) == family.groups and sum(row) == tokens * family.topk_group
        else:
            assert experts["groups"] == []
        a2a = msg["a2a"]
        assert a2a["ep_size"] == 2 and a2a["mode"] == "modeled"
        busy += tokens > 0 and a2a["bytes"][0][1] + a2a["bytes"][1][0] > 0
    assert busy >= MIN_STEPS  # tokens crossed between the ranks in the busy steps


def test_status_gives_kv_bytes_per_token(recorded: Recorded) -> None:
    kv = recorded.get("/api/status").json()["kv_bytes_per_token"]
    assert kv["per_layer"] == recorded.family.kv_per_layer
    assert kv["all_layers"] == 3 * recorded.family.kv_per_layer  # dense layers cache too
    assert kv["layout"] == ("latent" if "deepseek" in recorded.family.checkpoint else "kv")


def test_placement_covers_the_moe_layers_and_rebalances(recorded: Recorded) -> None:
    url = recorded.served.url
    before = httpx.get(url + "/api/experts").json()
    assert before["ep_size"] == 2 and before["mode"] == "modeled"
    assert before["moe_layers"] == recorded.family.moe_layers  # the real index of each row
    assert len(before["placement"]) == len(recorded.family.moe_layers)
    resp = httpx.post(url + "/api/experts/rebalance", json={"window": 64}, timeout=60)
    assert resp.status_code == 200, resp.text
    after = httpx.get(url + "/api/experts").json()
    assert after["version"] == before["version"] + 1
    assert len(after["placement"]) == len(recorded.family.moe_layers)


def test_the_recording_replays_step_for_step(recorded: Recorded) -> None:
    resp = recorded.get(f"/api/sessions/{recorded.session}")
    assert resp.status_code == 200, resp.text
    ws_url = recorded.served.url.replace("http://", "ws://")
    replayed: list[dict[str, Any]] = []
    with ws_connect(f"{ws_url}/ws/replay/{recorded.session}?speed=1000") as ws:
        while len(replayed) < len(recorded.steps):
            msg = json.loads(ws.recv(timeout=60))
            if "replay" not in msg:  # control answers carry "replay"; steps do not
                replayed.append(msg)
    assert [m["step"] for m in replayed] == [m["step"] for m in recorded.steps]
    for live, stored in zip(recorded.steps, replayed, strict=True):
        assert stored["experts"] == live["experts"] and stored["kv"] == live["kv"]


def test_the_twin_fits_the_session_and_answers_a_whatif(recorded: Recorded) -> None:
    body = {"knobs": {"max_num_seqs": 2}, "source": recorded.session, "horizon_s": 600}
    resp = httpx.post(recorded.served.url + "/api/whatif", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["requests"] == REQUESTS + 1 and out["fit"]["steps"] >= MIN_STEPS
    cur, cand = out["current"], out["candidate"]
    assert cur["knobs"]["max_num_seqs"] == 4 and cand["knobs"]["max_num_seqs"] == 2
    assert cur["unfinished"] == cand["unfinished"] == 0
    # half the batch slots: the queued requests wait longer for their first token
    assert cand["ttft_p90_ms"] > cur["ttft_p90_ms"]


def test_the_live_twin_answers_as_the_autopilot_asks_it(recorded: Recorded) -> None:
    """The twin fitted on the live window's steps, routed counts and queue (the autopilot's
    evaluator), on this family's steps."""
    body = {"knobs": {"max_num_seqs": 2}, "source": "live", "horizon_s": 5}
    resp = httpx.post(recorded.served.url + "/api/whatif", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["source"] == "live" and out["fit"]["steps"] >= MIN_STEPS
    assert out["candidate"]["knobs"]["max_num_seqs"] == 2


def test_the_autopilot_ticks_over_the_live_window(recorded: Recorded) -> None:
    """Each tick drains the live window (routed counts of the MoE layers only) and measures; a
    tick that raised would end its loop, and the ticks would stop."""
    url = recorded.served.url + "/api/autopilot"
    runner = state_of(recorded.served.app).autopilot
    assert runner is not None
    ticks = runner.ticks
    resp = httpx.put(url, json={"enabled": True, "interval_s": 0.2}, timeout=30)
    assert resp.status_code == 200, resp.text
    try:
        wait_for(lambda: runner.ticks >= ticks + 5, what="five autopilot ticks")
        state = httpx.get(url, timeout=30).json()["state"]
    finally:
        httpx.put(url, json={"enabled": False}, timeout=30)
    assert state in ("waiting", "holding")  # an idle engine: nothing to change


def test_attribution_splits_each_request_live_and_recorded(recorded: Recorded) -> None:
    queued = 0
    for rid in recorded.ids:
        live = recorded.get(f"/api/requests/{rid}/timeline")
        assert live.status_code == 200, live.text
        t = live.json()
        assert t["output_len"] == MAX_TOKENS
        ttft, after = sum(t["ttft"].values()), sum(t["after_first_token"].values())
        assert ttft == pytest.approx(t["ttft_ms"], rel=0.02)
        assert ttft + after == pytest.approx(t["e2e_ms"], rel=0.02), json.dumps(t)
        queued += "queue_slots" in t["ttft"]
        stored = recorded.get(f"/api/sessions/{recorded.session}/requests/{rid}/timeline").json()
        assert {k: stored[k] for k in ("ttft", "after_first_token")} == {
            k: t[k] for k in ("ttft", "after_first_token")
        }
    assert queued >= REQUESTS - 4  # four slots
    report = recorded.get(f"/api/sessions/{recorded.session}/attribution").json()
    assert report["requests"] == REQUESTS + 1


def test_metrics_label_expert_layers_by_their_real_index(recorded: Recorded) -> None:
    resp = recorded.get("/metrics")
    assert resp.status_code == 200
    layers: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            if sample.name == "moescope:expert_tokens_total":
                layer = sample.labels["layer"]
                layers[layer] = layers.get(layer, 0.0) + sample.value
    assert sorted(map(int, layers)) == recorded.family.moe_layers
    first = sum(sum(m["experts"]["counts"][0]) for m in recorded.steps)
    assert layers[str(recorded.family.moe_layers[0])] == first
