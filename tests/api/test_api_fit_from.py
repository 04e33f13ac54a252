"""`--fit-from`: a server whose live twin is fitted from a session recorded by a real server in a
real SQLite file predicts before its own steps could, and refuses a session it cannot use."""

from collections.abc import Iterator

import httpx
import pytest
from api_servers import MODEL, recorded_session, serve, stop, traffic, wait_idle

from api.app import create_app
from api.launch import build_loop
from cli.main import main
from engine.errors import InvalidInput
from server.settings import ServerSettings
from storage import SessionNotFound
from tuning.twin.cost_model import MIN_STEPS

pytestmark = pytest.mark.slow  # a server records a session first


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A database and a session of 32 requests recorded in it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('fit_from') / 'moescope.db'}"
    yield url, recorded_session(url, 32, 20)


def live_whatif(url: str) -> httpx.Response:
    body = {"knobs": {"max_num_seqs": 2}, "source": "live", "horizon_s": 30}
    return httpx.post(url + "/api/whatif", json=body, timeout=120)


def test_a_seeded_twin_predicts_after_one_request(recorded: tuple[str, str]) -> None:
    url, session = recorded
    seeded = serve(ServerSettings(model_name=MODEL, db_url=url, fit_from=session))
    bare = serve(ServerSettings(model_name=MODEL, db_url=url))
    try:
        status = httpx.get(seeded.url + "/api/status").json()
        assert status["fit_from"]["session"] == session
        assert status["fit_from"]["rows"] >= MIN_STEPS
        assert httpx.get(bare.url + "/api/status").json()["fit_from"] is None
        resp = live_whatif(seeded.url)  # fitted, but no expert loads of its own to draw yet
        assert resp.status_code == 422 and "routed no token" in resp.json()["error"]["message"]
        for served in (seeded, bare):
            traffic(served.loop, 1, 4)  # a few steps of its own: fewer than a fit needs
            wait_idle(served.loop)
        resp = live_whatif(seeded.url)
        assert resp.status_code == 200, resp.text
        assert resp.json()["fit"]["steps"] >= status["fit_from"]["rows"]
        resp = live_whatif(bare.url)
        assert resp.status_code == 422 and "too few steps" in resp.json()["error"]["message"]
    finally:
        stop(seeded)
        stop(bare)


def test_a_session_of_another_engine_is_refused_naming_what_differs(
    recorded: tuple[str, str],
) -> None:
    url, session = recorded
    loop = build_loop(MODEL, num_kv_blocks=256, ep_size=2)
    try:
        with pytest.raises(InvalidInput) as exc:
            create_app(loop, ServerSettings(model_name=MODEL, db_url=url, fit_from=session))
    finally:
        loop.stop()
    assert exc.value.param == "fit_from"
    assert "engine_config.parallel.ep_size 1 (here 2)" in str(exc.value)


def test_without_a_database_or_the_session_the_server_does_not_start(
    recorded: tuple[str, str],
) -> None:
    url, _ = recorded
    loop = build_loop(MODEL, num_kv_blocks=256)
    try:
        with pytest.raises(InvalidInput, match="needs --db"):
            create_app(loop, ServerSettings(model_name=MODEL, fit_from="any"))
        with pytest.raises(SessionNotFound):
            create_app(loop, ServerSettings(model_name=MODEL, db_url=url, fit_from="nope"))
    finally:
        loop.stop()
    argv = ["serve", "--model", MODEL, "--db", url, "--no-record", "--fit-from", "nope"]
    with pytest.raises(SystemExit, match="^moescope serve: no session 'nope'$"):
        main(argv)
