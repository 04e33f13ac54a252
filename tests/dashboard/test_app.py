"""Streamlit AppTest of the live and replay pages against a real running server."""

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_servers import TIMEOUT, Served, traffic, wait_idle
from streamlit.testing.v1 import AppTest

from dashboard.client import get_knobs

pytestmark = pytest.mark.slow

APP = str(Path(__file__).parents[2] / "dashboard" / "app.py")


def _app(served: Served) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["url"] = served.url
    return at.run()


def _charts_args(at: AppTest) -> dict[str, Any]:
    """The arguments of the page's one live-charts component."""
    (charts,) = [
        c for c in at.get("component_instance") if c.proto.component_name.endswith("live_charts")
    ]
    return json.loads(charts.proto.json_args)


def test_live_page_gives_the_browser_the_telemetry_socket(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOESCOPE_API_KEY", "sk-browser")
    at = _app(served)
    assert not at.exception
    args = _charts_args(at)
    assert args["source"] == served.ws_url + "?bundle=1"
    assert args["token"] == "sk-browser"
    assert (args["max_steps"], args["shown"], args["replay"]) == (600, 300, False)
    # the server draws no telemetry chart: only the sidebar's placement map (and "Why slow?")
    drawn = [c.proto.id for c in at.get("plotly_chart") if "-why_" not in c.proto.id]
    assert len(drawn) == 1 and drawn[0].endswith("-placement")


def test_rebalance_posts_to_the_server_and_shows_its_answer(served: Served) -> None:
    traffic(served.loop, 4, 16)
    wait_idle(served.loop)
    before = httpx.get(served.url + "/api/experts").json()["version"]
    at = _app(served)
    at.number_input(key="rebalance_window").set_value(32)
    at.number_input(key="rebalance_replicas").set_value(1)
    at.button(key="rebalance").click().run()
    assert not at.exception
    assert httpx.get(served.url + "/api/experts").json()["version"] == before + 1
    assert at.success[0].value.startswith(f"placement v{before + 1}: predicted imbalance")
    assert "1 replicas" in at.success[0].value
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    (placement,) = [s for s in specs if s["layout"]["title"]["text"].startswith("Placement")]
    assert placement["layout"]["title"]["text"].startswith(f"Placement v{before + 1} ")
    z = placement["data"][0]["z"]
    assert len(z) == 2 and {rank for row in z for rank in row} == {0, 1}
    at.number_input(key="rebalance_replicas").set_value(999)
    at.button(key="rebalance").click().run()
    assert "replicas (999) must be at most" in at.error[0].value
    assert httpx.get(served.url + "/api/experts").json()["version"] == before + 1


def test_apply_sends_the_patch_and_shows_a_refusal(served: Served) -> None:
    at = _app(served)
    version = get_knobs(served.url)["version"]
    at.number_input(key=f"knob_max_num_seqs_v{version}").set_value(6)
    at.button(key="apply").click().run()
    assert not at.exception
    assert get_knobs(served.url)["knobs"]["max_num_seqs"] == 6
    assert "accepted as version" in at.success[0].value
    version += 1
    at.number_input(key=f"knob_max_num_batched_tokens_v{version}").set_value(2)
    at.button(key="apply").click().run()
    assert "must be at least max_num_seqs (6)" in at.error[0].value
    assert get_knobs(served.url)["knobs"]["max_num_batched_tokens"] != 2


def _replay_script() -> None:
    from dashboard import replay

    replay.page()


def test_replay_page_gives_the_browser_the_replay_socket(served: Served) -> None:
    traffic(served.loop, 2, 8)
    wait_idle(served.loop)
    at = AppTest.from_function(_replay_script, default_timeout=TIMEOUT)
    at.session_state["url"] = served.url
    at.run()
    assert not at.exception
    assert not at.get("component_instance")  # nothing played yet
    session = at.selectbox(key="replay_session").value["id"]
    assert session == served.loop.engine.session
    at.selectbox(key="replay_speed").set_value(0.0)
    at.button(key="replay_play").click().run()
    assert not at.exception
    args = _charts_args(at)
    assert args["source"] == served.url.replace("http", "ws") + f"/ws/replay/{session}?speed=0.0"
    assert (args["replay"], args["speed"], args["nonce"]) == (True, 0.0, 1)
    at.button(key="replay_play").click().run()  # the same again: the browser starts over
    assert _charts_args(at)["nonce"] == 2


def test_preview_shows_the_twins_prediction_and_applies_nothing(served: Served) -> None:
    traffic(served.loop, 6, 64)  # enough busy steps for the live twin to fit
    wait_idle(served.loop)
    at = _app(served)
    state = get_knobs(served.url)
    version, seqs = state["version"], state["knobs"]["max_num_seqs"]
    at.number_input(key=f"knob_max_num_seqs_v{version}").set_value(seqs // 2)
    at.button(key="preview").click().run()
    assert not at.exception
    assert get_knobs(served.url)["version"] == version  # a preview applies nothing
    # the preview's table (the scorecard's is there too once it has an entry for a change)
    (table,) = [t.value for t in at.table if "metric" in t.value.columns]
    rows = {row["metric"]: row for row in table.to_dict("records")}
    assert set(rows["TTFT p90 ms"]) == {"metric", "now", "with the change", "change"}
    assert rows["throughput tok/s"]["now"] != "–"
    assert any(f"max_num_seqs = {seqs // 2}" in c.value for c in at.caption)
    at.button(key="apply").click().run()  # the prediction stays beside the applied change
    assert "accepted as version" in at.success[0].value
    assert len(at.table) >= 1 and any("preview of" in c.value for c in at.caption)
