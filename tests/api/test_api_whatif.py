"""The what-if twin over HTTP and on the command line: sessions recorded by real servers into a
real SQLite file, a live engine under load, the knob-change scorecard, `moescope whatif` and
`moescope tune` (with --verify against a real server)."""

import json
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from api_servers import MODEL, Served, recorded_session, serve, stop, wait_for, wait_idle

import stats
from cli.main import main
from engine import SamplingParams
from engine.loop import EngineLoop
from engine.outputs import RequestDelta, RequestOutput
from server.settings import ServerSettings
from storage import Store
from storage import queries as q
from storage import scorecard as db_scorecard
from tuning.twin.cost_model import MIN_STEPS
from tuning.twin.outcome import METRICS, outcome, step_totals
from tuning.twin.tune import evaluate
from tuning.twin.whatif import twin_from_recording

pytestmark = pytest.mark.slow  # servers record real sessions for the twin first

HORIZON_S = 3.0  # the scorecard's: short, so observations come within the test, yet long
# enough for the twin's simulations of one change (3 a side) to end within it on a busy machine
RECORDED = 32  # requests of the recorded load


@dataclass
class Databases:
    url: str
    short: str  # a session too short to fit a cost model
    recorded: str  # a session of real load
    live: Served  # a server on the same database, for live what-ifs, the scorecard, --verify

    def whatif(self, body: dict[str, Any], served: Served | None = None) -> httpx.Response:
        url = (served or self.live).url
        return httpx.post(url + "/api/whatif", json=body, timeout=120)

    def scorecard(self, served: Served | None = None) -> dict[str, Any]:
        url = (served or self.live).url
        resp = httpx.get(url + "/api/whatif/scorecard", timeout=30)
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def recording(self) -> Any:
        store = Store(self.url, create=False)
        try:
            return q.recording(store, self.recorded)
        finally:
            store.close()


def submit(loop: EngineLoop, n: int, max_tokens: int) -> list["Future[RequestOutput]"]:
    """`n` greedy requests of distinct 24-token prompts, straight to the loop; each future gives
    the request's whole output."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    futures: list[Future[RequestOutput]] = []
    for i in range(n):
        future: Future[RequestOutput] = Future()

        def on_output(delta: RequestDelta, future: "Future[RequestOutput]" = future) -> None:
            if delta.output is not None:
                future.set_result(delta.output)

        loop.submit([256, *range(1 + i, 24 + i)], params, on_output)
        futures.append(future)
    return futures


def finish(futures: list["Future[RequestOutput]"]) -> list[RequestOutput]:
    return [f.result(timeout=120) for f in futures]


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Databases]:
    url = f"sqlite:///{tmp_path_factory.mktemp('whatif') / 'moescope.db'}"
    short = recorded_session(url, 2, 3)
    recorded = recorded_session(url, RECORDED, 20)
    live = serve(ServerSettings(model_name=MODEL, db_url=url, whatif_horizon_s=HORIZON_S))
    yield Databases(url, short, recorded, live)
    stop(live)


def test_a_session_whatif_gives_both_sides_and_the_fit_error(dbs: Databases) -> None:
    resp = dbs.whatif({"knobs": {"max_num_seqs": 2}, "source": dbs.recorded, "horizon_s": 600})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    cur, cand = out["current"], out["candidate"]
    assert cur["knobs"]["max_num_seqs"] == 8
    assert cand["knobs"] == {**cur["knobs"], "max_num_seqs": 2}
    for side in (cur, cand):
        assert set(METRICS) <= set(side) and side["unfinished"] == 0
        assert len(side["latencies_ms"]) == RECORDED
        for metric in METRICS:  # each a median over the simulations, inside its 80% band
            low, high = side["bands"][metric]
            assert low <= side[metric] <= high, metric
        assert side["saturation"]["draws"] == out["draws"] > 1
    assert out["requests"] == RECORDED and out["fit"]["steps"] >= MIN_STEPS
    assert out["fit"]["mape"] >= 0 and out["wall_s"] > 0 and out["fit"]["sessions"] == 1
    # two batch slots instead of eight: requests wait longer for their first token, and fewer
    # KV blocks are held at once
    assert cand["ttft_p90_ms"] > cur["ttft_p90_ms"]
    assert cand["peak_kv_blocks"] < cur["peak_kv_blocks"]
    expected = twin_from_recording(*dbs.recording()).compare({"max_num_seqs": 2}, 600)
    assert {k: out[k] for k in expected} == expected


def test_sessions_of_one_engine_pool_their_steps(dbs: Databases) -> None:
    """The first session's requests, the cost model fitted on both sessions' steps."""
    body = {"knobs": {"max_num_seqs": 2}, "source": [dbs.recorded, dbs.short], "horizon_s": 600}
    resp = dbs.whatif(body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    alone = dbs.whatif({**body, "source": dbs.recorded}).json()
    assert out["source"] == [dbs.recorded, dbs.short] and out["fit"]["sessions"] == 2
    assert out["requests"] == RECORDED and out["fit"]["steps"] > alone["fit"]["steps"]
    for source in (["live", dbs.recorded], [dbs.recorded] * 9, []):
        resp = dbs.whatif({**body, "source": source})
        assert resp.status_code == 422 and resp.json()["error"]["param"] == "source", source
    resp = dbs.whatif({**body, "source": [dbs.recorded, "nope"]})
    assert resp.status_code == 404 and "nope" in resp.json()["error"]["message"]


def test_an_unknown_session_is_404_naming_source(dbs: Databases) -> None:
    resp = dbs.whatif({"knobs": {"max_num_seqs": 2}, "source": "nope"})
    assert resp.status_code == 404
    assert resp.json()["error"]["param"] == "source" and "nope" in resp.json()["error"]["message"]


def test_a_session_too_short_to_fit_says_how_many_steps_it_needs(dbs: Databases) -> None:
    resp = dbs.whatif({"knobs": {"max_num_seqs": 2}, "source": dbs.short})
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["param"] == "source" and f"at least {MIN_STEPS} busy steps" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"knobs": {"max_num_seqs": 0}}, "max_num_seqs"),
        ({"knobs": {"max_num_seqs": "8"}}, "max_num_seqs"),  # strict JSON types, as PATCH
        ({"knobs": {"max_num_seqs": True}}, "max_num_seqs"),
        ({"knobs": {"prefill_chunk_size": 4096}}, "prefill_chunk_size"),  # over the budget
        ({"knobs": {"bogus": 1}}, "bogus"),
        ({"knobs": {}}, "knobs"),
        ({"knobs": {"max_num_seqs": 4}, "horizon_s": 0}, "horizon_s"),
        ({"knobs": {"max_num_seqs": 4}, "horizon_s": 1e6}, "horizon_s"),
        ({"knobs": {"max_num_seqs": 4}, "horizon_s": "60"}, "horizon_s"),
        ({"knobs": {"max_num_seqs": 4}, "speed": 2}, "speed"),
    ],
)
def test_bad_input_is_422_naming_the_field(
    dbs: Databases, body: dict[str, Any], param: str
) -> None:
    resp = dbs.whatif({"source": dbs.recorded, **body})
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["param"] == param


def test_without_database_or_steps_the_server_says_so(dbs: Databases) -> None:
    """A fresh server with no database: the live twin has no steps, sessions need --db, and
    the scorecard keeps in memory a knob change it could not predict, observed all the same."""
    served = serve(ServerSettings(model_name=MODEL, whatif_horizon_s=HORIZON_S))
    try:
        resp = dbs.whatif({"knobs": {"max_num_seqs": 4}, "source": "live"}, served)
        assert resp.status_code == 422 and resp.json()["error"]["param"] == "source"
        assert "has seen too few steps" in resp.json()["error"]["message"]
        resp = dbs.whatif({"knobs": {"max_num_seqs": 4}, "source": dbs.recorded}, served)
        assert resp.status_code == 503 and "--db" in resp.json()["error"]["message"]
        patch = httpx.patch(served.url + "/api/knobs", json={"max_num_seqs": 4})
        version = patch.json()["version"]  # applied at once by the idle engine's empty step
        wait_for(
            lambda: any(e["observed"] for e in dbs.scorecard(served)["entries"]),
            timeout=60,
            what="the change's observation",
        )
        card = dbs.scorecard(served)
        assert card["stored"] is False and "memory" in card["note"]
        (entry,) = card["entries"]
        assert entry["version"] == version and entry["changes"] == {"max_num_seqs": [8, 4]}
        assert entry["predicted"] is None and entry["errors"] is None
        assert entry["reason"].startswith("no prediction: the live engine has seen too few steps")
        assert entry["observed"]["steps"] >= 1 and entry["observed"]["requests"] == 0
    finally:
        stop(served)


def _engine_state(loop: EngineLoop) -> dict[str, Any]:
    s = loop.summary()
    return {
        "queue": s["queue"],
        "kv": s["kv"],
        "knobs": s["knobs"],
        "versions": (s["knobs_version"], s["applied_knobs_version"]),
        "history": loop.knob_history(),
        "steps": loop.steps,
        "requests": len(loop.engine.requests),
    }


def test_a_live_whatif_changes_nothing_in_the_engine(dbs: Databases) -> None:
    loop = dbs.live.loop
    finish(submit(loop, RECORDED, 20))  # steps for the live cost model to fit
    knobs, version = loop.summary()["knobs"], loop.summary()["knobs_version"]
    load = submit(loop, 24, 40)
    body = {"knobs": {"max_num_seqs": 2, "policy": "shortest_first"}, "source": "live"}
    resp = dbs.whatif({**body, "horizon_s": 5})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["source"] == "live" and out["current"]["knobs"] == knobs
    assert out["candidate"]["knobs"] == {**knobs, **body["knobs"]}
    assert out["fit"]["steps"] >= MIN_STEPS and out["requests"] > 0
    assert any("KV cache in place" in note for note in out["approximations"])
    # the load under way ran to its end, every request whole, under the knobs it started with
    assert all(o.finish_reason == "length" and len(o.token_ids) == 40 for o in finish(load))
    assert loop.summary()["knobs"] == knobs and loop.summary()["knobs_version"] == version
    wait_idle(loop)
    before = _engine_state(loop)
    resp = dbs.whatif({**body, "horizon_s": 5})
    assert resp.status_code == 200, resp.text
    assert _engine_state(loop) == before  # not even an empty step


def test_every_applied_knob_change_is_predicted_then_observed(dbs: Databases) -> None:
    loop = dbs.live.loop
    finish(submit(loop, RECORDED, 20))  # steps for the live cost model to fit
    knobs = loop.summary()["knobs"]
    seqs, policy = knobs["max_num_seqs"], knobs["policy"]
    new_seqs, new_policy = seqs % 8 + 2, "shortest_first" if policy == "fcfs" else "fcfs"
    load = submit(loop, 24, 40)
    resp = httpx.patch(dbs.live.url + "/api/knobs?origin=test", json={"max_num_seqs": new_seqs})
    by_api = resp.json()["version"]
    # a change that does not come through the API is seen in the step telemetry all the same
    by_engine = loop.update_knobs({"policy": new_policy}, origin="autopilot").result(10)
    finish(load)

    def observed() -> dict[int, dict[str, Any]]:
        entries = dbs.scorecard()["entries"]
        return {e["version"]: e for e in entries if e["observed"] is not None}

    wait_for(lambda: {by_api, by_engine} <= set(observed()), timeout=60, what="both observations")
    card = dbs.scorecard()
    assert card["stored"] is True and card["horizon_s"] == HORIZON_S
    entries = observed()
    first, second = entries[by_api], entries[by_engine]
    assert first["predicted"] and second["predicted"], (first["reason"], second["reason"])
    assert first["origin"] == "test" and first["changes"] == {"max_num_seqs": [seqs, new_seqs]}
    assert second["origin"] == "autopilot" and second["changes"] == {"policy": [policy, new_policy]}
    assert first["predicted"]["current"]["knobs"]["max_num_seqs"] == seqs
    assert first["predicted"]["candidate"]["knobs"]["max_num_seqs"] == new_seqs
    assert second["predicted"]["current"]["knobs"] == {**knobs, "max_num_seqs": new_seqs}
    assert second["predicted"]["candidate"]["knobs"]["policy"] == new_policy
    for entry in (first, second):
        assert entry["reason"] is None and entry["predicted"]["fit"]["steps"] >= MIN_STEPS
        assert entry["predicted"]["draws"] == entry["predicted"]["candidate"]["saturation"]["draws"]
        assert set(entry["predicted"]["candidate"]["bands"]) >= set(METRICS)
        assert entry["observed"]["steps"] >= 1
        assert entry["observed_t"] >= entry["t"] + HORIZON_S
        for m in METRICS:
            assert entry["errors"][m]["predicted"] == entry["predicted"]["candidate"][m]
            assert entry["errors"][m]["observed"] == entry["observed"][m]
    store = Store(dbs.url, create=False)
    try:
        stored = {e["version"]: e for e in db_scorecard.entries(store, 100)}
    finally:
        store.close()
    assert stored[by_api] == first and stored[by_engine] == second


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    main(list(argv))
    return capsys.readouterr().out


def test_whatif_prints_current_against_predicted(
    dbs: Databases, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["whatif", dbs.recorded, "--set", "max_num_seqs=2", "--set", "policy=shortest_first"]
    text = _run(capsys, *argv, "--db", dbs.url)
    rows = {line.split("  ")[0]: line.split() for line in text.splitlines()}
    assert rows["max_num_seqs"][1:] == ["8", "2"]
    assert rows["policy"][1:] == ["fcfs", "shortest_first"]
    assert "TTFT p90 ms" in rows and "current" in text and "predicted" in text
    # medians with their bands, `120 [95-160]`, and how often the queue built
    assert sum(cell.startswith("[") for cell in rows["TTFT p90 ms"]) == 2
    assert "median of the simulations [80% band]" in text
    assert rows["queue builds in"][3].endswith("/10")
    assert "simulations" in text.splitlines()[-2]
    result = json.loads(_run(capsys, *argv, "--db", dbs.url, "--json"))
    changes = {"max_num_seqs": 2, "policy": "shortest_first"}
    expected = twin_from_recording(*dbs.recording()).compare(changes)
    assert {k: result[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["whatif", "nope", "--set", "max_num_seqs=2"], "no session 'nope'"),
        (["whatif", "{recorded}", "--set", "max_num_sqs=2"], "max_num_sqs"),
        (["whatif", "{recorded}", "--set", "max_num_seqs=0"], "max_num_seqs"),
        (["whatif", "{short}", "--set", "max_num_seqs=2"], f"at least {MIN_STEPS} busy steps"),
        (["tune", "{recorded}", "--slo", "ttft_p90_ms=800", "--knobs", "policy,bogus"], "bogus"),
    ],
)
def test_bad_input_is_a_one_line_error(dbs: Databases, argv: list[str], words: str) -> None:
    argv = [a.format(recorded=dbs.recorded, short=dbs.short) for a in argv]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--db", dbs.url])
    message = str(info.value)
    assert message.startswith(f"moescope {argv[0]}: ") and words in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["whatif", "s", "--set", "max_num_seqs"], "must be KNOB=VALUE"),
        (["tune", "s", "--slo", "ttft_ms=800"], "ttft_pNN_ms"),
        (["tune", "s", "--slo", "ttft_p90_ms=800,tpot_p99_ms=60"], "one percentile"),
        (["tune", "s", "--slo", "ttft_p90_ms=-1"], "ttft_p90_ms"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and words in capsys.readouterr().err


def _tune(dbs: Databases, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    argv = ["tune", dbs.recorded, "--slo", "ttft_p90_ms=800,tpot_p90_ms=60"]
    argv += ["--knobs", "max_num_seqs,policy", "--db", dbs.url, "--json", *extra]
    return dict(json.loads(_run(capsys, *argv)))


def test_tune_reports_the_best_settings_for_goodput_and_attainment(
    dbs: Databases, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _tune(dbs, capsys, "--trials", "3")
    assert report["settings"] == 4  # the session's own setting and 3 of the grid
    assert report["current"]["changes"] == {"max_num_seqs": 8, "policy": "fcfs"}
    twin, slo = twin_from_recording(*dbs.recording()), stats.SLO(800, 60)
    for key, score in (("best_goodput", "goodput_rps"), ("best_attainment", "slo_attainment")):
        best = report[key]
        assert best[score] >= report["current"][score]
        trial = evaluate(twin, best["changes"], slo)
        assert trial.outcome is not None
        assert (best["goodput_rps"], best["slo_attainment"]) == (
            trial.goodput_rps,
            trial.slo_attainment,
        )
        low, high = trial.outcome["bands"]["goodput_rps"]
        assert low <= trial.goodput_rps <= high
        assert best["bands"] == trial.outcome["bands"] and best["saturation"]["draws"] == 10
    text = _run(
        capsys,
        *["tune", dbs.recorded, "--slo", "ttft_p90_ms=800,tpot_p90_ms=60", "--trials", "2"],
        *["--knobs", "max_num_seqs", "--db", dbs.url],
    )
    assert "best goodput" in text and "meets 90% target" in text


def test_tune_verify_applies_the_best_reruns_and_measures(
    dbs: Databases, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _tune(dbs, capsys, "--trials", "2", "--verify", dbs.live.url)
    measured = report["verify"]
    knobs = httpx.get(dbs.live.url + "/api/knobs").json()
    assert knobs["knobs"] == report["best_goodput"]["knobs"]
    assert knobs["version"] >= measured["knobs_version"]
    rerun = httpx.get(dbs.live.url + f"/api/sessions/{measured['session']}").json()
    assert rerun["parent"] == dbs.recorded and rerun["requests"] == RECORDED
    assert len(measured["latencies_ms"]) == RECORDED
    store = Store(dbs.url, create=False)
    try:
        steps = q.all_steps(store, measured["session"])
        expected = outcome(q.requests(store, measured["session"]), step_totals(steps))
    finally:
        store.close()
    assert {m: measured[m] for m in METRICS} == {m: expected[m] for m in METRICS}
