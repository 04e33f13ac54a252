"""The Compare page: pure summary functions, and an AppTest against a server with a rerun."""

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_servers import MODEL, TIMEOUT, Served, serve, stop, traffic, wait_for, wait_idle
from frames import frames
from streamlit.testing.v1 import AppTest

from dashboard.compare import delta_rows, layer_imbalance, summarize, tpot_ms
from dashboard.compare_page import CHARTS, MAX_CHART_STEPS
from server.settings import ServerSettings
from server.state import state_of


def _req(
    arrival: float, finished: float, ttft: float | None, out: int, e2e: float, preempt: int = 0
) -> dict[str, Any]:
    return {
        "req": "r",
        "arrival": arrival,
        "finished_t": finished,
        "prompt_len": 10,
        "output_len": out,
        "max_tokens": out,
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "finish_reason": "length",
        "preemptions": preempt,
    }


def test_tpot_excludes_the_first_token() -> None:
    assert tpot_ms(_req(0, 1, 100.0, 11, 600.0)) == 50.0
    assert tpot_ms(_req(0, 1, 100.0, 1, 600.0)) is None
    assert tpot_ms(_req(0, 1, None, 11, 600.0)) is None


def test_layer_imbalance_is_max_over_mean_averaged_over_steps() -> None:
    # frames(): layer 0 counts [6,2,2,2] -> 6/3 = 2.0; layer 1 [3,3,3,3] -> 1.0
    assert layer_imbalance(frames(5)) == [2.0, 1.0]
    idle = frames(1)[0]
    idle["experts"]["counts"] = [[0, 0, 0, 0], [0, 0, 0, 0]]
    assert all(math.isnan(x) for x in layer_imbalance([idle]))


def test_summarize_and_deltas() -> None:
    reqs = [_req(0.0, 2.0, 100.0, 11, 600.0, 1), _req(1.0, 4.0, 300.0, 21, 1300.0)]
    a = summarize({"id": "a", "mean_step_ms": 5.0, "steps": 30}, frames(30), reqs)
    assert a["output_tok_s"] == pytest.approx(32 / 4)
    assert a["total_tok_s"] == pytest.approx(52 / 4)
    assert a["ttft_p50_ms"] == 200.0 and a["tpot_p50_ms"] == 50.0
    assert a["preemptions"] == 1 and a["imbalance"] == 1.5 and a["mean_step_ms"] == 5.0
    b = summarize({"id": "b"}, frames(10), reqs[1:])
    assert b["mean_step_ms"] == pytest.approx(2.4)  # from dur_ms.total when the server has none
    rows = {r["metric"]: r for r in delta_rows(a, b)}
    step = rows["mean step ms"]
    assert step["A"] == "5.00" and step["B"] == "2.40" and step["B − A"] == "-2.60"
    assert step["B / A"] == "0.480x" and step["better"] == "B"
    assert rows["preemptions"]["B − A"] == "-1" and rows["preemptions"]["better"] == "B"
    assert rows["throughput (output tokens/s)"]["better"] == "A"  # 21/3 s < 32/4 s
    empty = summarize({"id": "e"}, [], [])
    assert empty["output_tok_s"] is None and empty["imbalance"] is None
    assert {r["better"] for r in delta_rows(empty, empty)} == {"–", "="}


@pytest.fixture(scope="module")
def with_rerun(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str, str]]:
    """A recording server, its session after some traffic, and a finished rerun of it."""
    db = tmp_path_factory.mktemp("cmpdb") / "moescope.db"
    served = serve(ServerSettings(model_name=MODEL, db_url=f"sqlite:///{db}", record=True))
    try:
        traffic(served.loop, 4, 12)
        wait_idle(served.loop)
        original = served.loop.engine.session
        recorder = state_of(served.server.server.config.app).recorder
        wait_for(
            lambda: (
                recorder.flush()
                and httpx.get(served.url + f"/api/sessions/{original}/requests").json()["requests"]
            ),
            what="the requests to be recorded",
        )
        resp = httpx.post(served.url + f"/api/sessions/{original}/rerun?speed=50")
        assert resp.status_code == 202, resp.text
        new = resp.json()["session"]
        wait_for(
            lambda: (
                httpx.get(served.url + f"/api/sessions/{new}").json().get("ended_t") is not None
            ),
            60,
            "the rerun to finish",
        )
        assert recorder.flush()
        yield served, original, new
    finally:
        stop(served)


def _charts_args(at: AppTest) -> dict[str, Any]:
    """The arguments of the page's live-charts component (but its key and default)."""
    (charts,) = at.get("component_instance")
    assert charts.proto.component_name.endswith("live_charts")
    assert charts.proto.id.endswith("-cmp_charts")
    args = json.loads(charts.proto.json_args)
    return {k: v for k, v in args.items() if k not in ("key", "default")}


def _compare_script() -> None:
    from dashboard import compare_page

    compare_page.page()


@pytest.mark.slow
def test_compare_page_shows_an_original_and_its_rerun(
    with_rerun: tuple[Served, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOESCOPE_API_KEY", "sk-browser")  # the browser reads steps with it
    served, original, rerun = with_rerun
    at = AppTest.from_function(_compare_script, default_timeout=TIMEOUT)
    at.session_state["url"] = served.url
    at.run()
    assert not at.exception
    assert at.selectbox(key="cmp_a").value["id"] == original
    assert at.selectbox(key="cmp_b").value["id"] == rerun
    table = at.dataframe[0].value
    assert list(table["metric"])[0] == "throughput (output tokens/s)"
    reqs = table.set_index("metric").loc["requests"]
    assert reqs["A"] == reqs["B"] == "4"
    # the charts are the live-charts component's, a column a session, each reading that
    # session's recorded steps from the server in the browser; the server draws none
    assert not at.get("plotly_chart")
    assert _charts_args(at) == {
        "sources": [f"{served.url}/api/sessions/{s}/steps" for s in (original, rerun)],
        "titles": [f"A: {original}", f"B: {rerun}"],
        "recorded": True,
        "token": "sk-browser",
        "max_steps": MAX_CHART_STEPS,
        "shown": MAX_CHART_STEPS,
        "reports": [],
        "panels": list(CHARTS),
        "replay": False,
    }
    at.selectbox(key="cmp_b").set_value(at.selectbox(key="cmp_a").value).run()
    assert not at.exception
    assert set(at.dataframe[0].value["better"]) <= {"=", "–"}
    sources = _charts_args(at)["sources"]
    assert sources[0] == sources[1] == f"{served.url}/api/sessions/{original}/steps"
