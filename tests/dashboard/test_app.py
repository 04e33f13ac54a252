"""Streamlit AppTest of the live and replay pages against a real running server."""

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_servers import TIMEOUT, Served, traffic, wait_for, wait_idle
from streamlit.testing.v1 import AppTest

from dashboard.charts import PANELS
from dashboard.client import get_knobs

pytestmark = pytest.mark.slow

APP = str(Path(__file__).parents[2] / "dashboard" / "app.py")


def _charts(at: AppTest) -> list[Any]:
    """The page's telemetry charts, without the "Why slow?" panel's (keys `why_...`) and the
    autopilot's (`autopilot_...`)."""
    return [
        c
        for c in at.get("plotly_chart")
        if "-why_" not in c.proto.id and "-autopilot_" not in c.proto.id
    ]


def _app(served: Served) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["url"] = served.url
    return at.run()


def test_live_page_draws_every_panel_from_the_stream(served: Served) -> None:
    at = _app(served)
    assert not at.exception
    stream = at.session_state["stream"]
    wait_for(lambda: stream.state == "connected", what="the stream to connect")
    traffic(served.loop, 4, 16)
    wait_for(lambda: stream.received >= 10, what="telemetry")
    at.run()
    assert not at.exception
    charts = _charts(at)
    assert len(charts) == len(PANELS) + 1  # the panels and the sidebar's placement map
    assert at.metric[0].value == "connected"
    assert int(at.metric[1].value) >= stream.frames()[0]["step"]
    stream.stop()


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
    at.session_state["stream"].stop()


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
    at.session_state["stream"].stop()


def _replay_script() -> None:
    from dashboard import replay

    replay.page()


def test_replay_page_plays_a_recorded_session_to_its_end(served: Served) -> None:
    traffic(served.loop, 2, 8)
    wait_idle(served.loop)
    at = AppTest.from_function(_replay_script, default_timeout=TIMEOUT)
    at.session_state["url"] = served.url
    at.run()
    assert not at.exception
    assert at.selectbox(key="replay_session").value["id"] == served.loop.engine.session
    at.selectbox(key="replay_speed").set_value(0.0)
    at.button(key="replay_play").click().run()
    stream = at.session_state["replay_stream"]
    wait_for(lambda: (stream.replay or {}).get("state") == "ended", what="the replay to end")
    at.run()
    assert not at.exception
    assert at.metric[0].value == "ended"
    assert len(_charts(at)) == len(PANELS)
    steps = [f["step"] for f in stream.frames()]
    assert steps == sorted(steps) and len(steps) >= 8
    stream.stop()


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
    at.session_state["stream"].stop()
