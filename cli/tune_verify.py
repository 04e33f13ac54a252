"""`moescope tune --verify URL`: a knob set applied on a running server, the session rerun there,
and the rerun measured with the twin's own outcome definitions."""

import os
import sys
import time
from typing import Any

import httpx

import stats
from tuning.twin.outcome import outcome, slo_scores, step_totals

POLL_S = 0.2  # between looks at the rerun's progress


class VerifyError(RuntimeError):
    """The server refused a call or the rerun did not finish: the message says which."""


def _call(
    client: httpx.Client, method: str, path: str, missing_ok: bool = False, **kwargs: Any
) -> Any:
    """The JSON answer; None for a 404 when `missing_ok`, VerifyError for other errors."""
    try:
        resp = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise VerifyError(f"cannot reach {client.base_url}: {exc}") from None
    if resp.status_code == 404 and missing_ok:
        return None
    if resp.status_code >= 400:
        try:
            message = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = resp.text[:200]
        raise VerifyError(f"{method} {path}: {resp.status_code} {message}")
    return resp.json()


def _headers() -> dict[str, str]:
    """The admin (or API) key from the environment, as the server's own commands take it."""
    key = os.environ.get("MOESCOPE_ADMIN_KEY") or os.environ.get("MOESCOPE_API_KEY")
    return {"authorization": f"Bearer {key}"} if key else {}


def verify(
    url: str, session_id: str, knobs: dict[str, Any], slo: stats.SLO, timeout_s: float
) -> dict[str, Any]:
    """Apply `knobs` (PATCH /api/knobs, origin `tune`), rerun `session_id` on the server and
    wait up to `timeout_s` for it to be recorded; the rerun's outcome and SLO scores, with
    its session id and the knobs version applied."""
    with httpx.Client(base_url=url, headers=_headers(), timeout=30) as client:
        applied = _call(client, "PATCH", "/api/knobs", params={"origin": "tune"}, json=knobs)
        rerun = _call(client, "POST", f"/api/sessions/{session_id}/rerun")["session"]
        print(f"rerunning {session_id} on {url} as {rerun} ...", file=sys.stderr, flush=True)
        steps, records = _recorded(client, rerun, time.monotonic() + timeout_s)
    result = outcome(records, step_totals(steps))
    return {
        "session": rerun,
        "knobs_version": applied["version"],
        **result,
        **slo_scores(result, slo),
    }


def _recorded(
    client: httpx.Client, session: str, deadline: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rerun's steps and requests once it has ended and all of them are written."""
    progress: dict[str, Any] = {}
    while True:
        # None until the recorder has written the new session's row
        info = _call(client, "GET", f"/api/sessions/{session}", missing_ok=True) or {}
        progress = info.get("rerun") or progress
        ended = info.get("ended_t") is not None and progress.get("done")
        if ended and info["requests"] >= progress["submitted"]:
            steps, records = _steps(client, session), _requests(client, session)
            # the step in which the last request finished is written by then too
            if steps and steps[-1]["t"] >= max((r["finished_t"] for r in records), default=0):
                return steps, records
        if time.monotonic() > deadline:
            raise VerifyError(
                f"rerun {session} was not recorded in time ({progress.get('finished', 0)} of "
                f"{progress.get('requests', '?')} requests finished)"
            )
        time.sleep(POLL_S)


def _steps(client: httpx.Client, session: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    start: int | None = 0
    while start is not None:
        page = _call(
            client, "GET", f"/api/sessions/{session}/steps", params={"from": start, "limit": 10000}
        )
        steps += page["steps"]
        start = page["next"]
    return steps


def _requests(client: httpx.Client, session: str) -> list[dict[str, Any]]:
    return list(_call(client, "GET", f"/api/sessions/{session}/requests")["requests"])
