"""A session served with --record-prompts keeps each prompt's tokens, and its rerun replays
them: the experts see the same tokens, so every layer's expert loads equal the original's."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from api_servers import MODEL, serve, stop, wait_idle
from storage_helpers import wait_for

from server.settings import ServerSettings
from server.state import state_of
from storage import Recorder, Store
from storage import queries as q

# distinct token sequences (prompt, max_tokens): not the seeded random ones a rerun makes up
PROMPTS = [(list(range(40, 70)), 6), ([(100 + 7 * i) % 300 for i in range(45)], 9), ([5] * 12, 4)]


def _complete(url: str, prompt: list[int], max_tokens: int) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    resp = httpx.post(url + "/v1/completions", json=body | {"ignore_eos": True}, timeout=60)
    assert resp.status_code == 200, resp.text


def _expert_load(store: Store, session: str) -> list[list[int]]:
    """Tokens each expert of each layer took over the whole session."""
    total: list[list[int]] = []
    for step in q.all_steps(store, session):
        counts = step["experts"]["counts"]
        total = total or [[0] * len(layer) for layer in counts]
        for row, layer in zip(total, counts, strict=True):
            for e, n in enumerate(layer):
                row[e] += n
    return total


def test_a_rerun_of_recorded_prompts_gives_the_same_expert_loads(tmp_path: Path) -> None:
    settings = ServerSettings(model_name=MODEL, db_url=f"sqlite:///{tmp_path / 'p.db'}")
    # no prefix caching: the rerun's prompts would hit the original's cached blocks
    served = serve(settings, enable_prefix_caching=False, record_prompts=True)
    try:
        app = state_of(served.app)
        store, rec = app.store, app.recorder
        assert isinstance(store, Store) and isinstance(rec, Recorder)
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            for job in [pool.submit(_complete, served.url, p, n) for p, n in PROMPTS]:
                job.result()
        wait_idle(served.loop)
        wait_for(lambda: rec.flush() and rec.written_steps == served.loop.steps, what="recording")
        original = served.loop.engine.session
        kept = q.requests(store, original, with_prompts=True)
        assert sorted(r["prompt_token_ids"] for r in kept) == sorted(p for p, _ in PROMPTS)

        resp = httpx.post(served.url + f"/api/sessions/{original}/rerun?speed=4")
        assert resp.status_code == 202, resp.text
        progress: dict[str, Any] = resp.json()
        assert progress["recorded_prompts"] == len(PROMPTS)
        rerun = progress["session"]
        wait_for(lambda: app.rerun is not None and app.rerun.done, what="the rerun")
        wait_idle(served.loop)
        assert rec.flush()
        replayed = q.requests(store, rerun, with_prompts=True)
        assert sorted(r["prompt_token_ids"] for r in replayed) == sorted(p for p, _ in PROMPTS)
        load = _expert_load(store, original)
        assert sum(map(sum, load)) > 0
        assert _expert_load(store, rerun) == load
    finally:
        stop(served)
