"""Latency attribution over the live window, run off the event loop on an AttributionView: one
ended request's timeline, or the report over the requests that ended in the last seconds."""

import math
from typing import Any

from server.live_window import AttributionView
from server.session_attribution import life_span
from storage import Recorder
from tuning.attribution.causes import attribute
from tuning.attribution.summary import report

# finish reasons reached inside a step: the engine publishes such a request's record just
# before that step's telemetry (aborts and errors come between steps, after their last step)
STEP_ENDS = ("stop", "length")


class TimelineMissing(LookupError):
    """No timeline for the request asked for; the message says why (a route answers 404)."""


def ended(view: AttributionView) -> list[dict[str, Any]]:
    """The ended requests whose every step the view holds (one that ended in a step waits
    for that step)."""
    newest = view.steps[-1]["t"] if view.steps else -math.inf
    return [
        r for r in view.records if r["finish_reason"] not in STEP_ENDS or r["finished_t"] <= newest
    ]


def covering(view: AttributionView, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kept steps of these requests' lives, chosen as a recorded session's are."""
    if not records:
        return []
    t0, t1 = life_span(records)
    return [s for s in view.steps if t0 <= s["t"] <= t1]


def live_timeline(view: AttributionView, req: str, recorder: Recorder | None) -> dict[str, Any]:
    """The timeline of ended request `req`; TimelineMissing saying why there is none."""
    record = next((r for r in reversed(ended(view)) if r["req"] == req), None)
    if record is None:
        raise TimelineMissing(missing(view, req, recorder))
    if record["arrival"] < view.kept_after:
        raise TimelineMissing(
            f"request {req!r} fell out of the live window: the steps since its arrival are no "
            "longer all kept" + elsewhere(recorder, record["arrival"], req, "read it in")
        )
    (timeline,) = attribute([record], covering(view, [record]))
    return {**timeline.as_dict(), "source": "live"}


def missing(view: AttributionView, req: str, recorder: Recorder | None) -> str:
    """Why the view holds no ended request `req`."""
    if ran_since(view, req):
        return f"request {req!r} has not ended yet: timelines are for ended requests"
    return (
        f"no request {req!r} ended in the live window (the last {view.t - view.since:.0f} s)"
        + elsewhere(recorder, view.t, req, "if it ended earlier, look in")
    )


def ran_since(view: AttributionView, req: str) -> bool:
    """Whether `req` ran or was preempted in a kept step that ended after `view.since`."""
    for step in reversed(view.steps):
        if step["t"] < view.since:
            return False
        slots = step["batch"]["slots"]
        if req in step["sched"]["preempted"] or any(x["req"] == req for x in slots):
            return True
    return False


def elsewhere(recorder: Recorder | None, t: float, req: str, lead: str) -> str:
    """Where the recording of a request that arrived at `t` can be read, if anywhere."""
    session = recorder.session_at(t) if recorder is not None else None
    if session is None:
        return "; this server records no session (start it with --db URL to keep every request)"
    return f"; {lead} its recording: GET /api/sessions/{session}/requests/{req}/timeline"


def live_report(
    view: AttributionView, window_s: float, bucket_s: float, recent: int
) -> dict[str, Any]:
    """The attribution report over the requests that ended in the last `window_s` seconds (as
    far back as the window keeps them); `fell_out` counts those left out, which arrived before
    the oldest step kept."""
    t0 = max(view.t - window_s, view.since)
    done = [r for r in ended(view) if r["finished_t"] >= t0]
    kept = [r for r in done if r["arrival"] >= view.kept_after]
    out = report(kept, covering(view, kept), bucket_s, recent)
    return {**out, "source": "live", "from": t0, "to": view.t, "fell_out": len(done) - len(kept)}
