"""Latency attribution of a recorded session, read from the database (for the session routes
and `moescope sessions show --attribution`); the steps a set of requests needs, for the live
window too."""

from typing import Any

from storage import Store
from storage import queries as q
from tuning.attribution.causes import attribute, require_version
from tuning.attribution.summary import report

# a step that started before a request ended may end up to its own duration later: steps
# ending this long after the end are read too (attribution clips what lies beyond the end)
MARGIN_S = 5.0
BUCKET_S = 5.0  # the report's default bucket over time
RECENT = 50  # the report's default number of latest timelines


def life_span(records: list[dict[str, Any]]) -> tuple[float, float]:
    """The times (`t`, a step's end) of the steps that may cover these ended requests' lives."""
    return min(r["arrival"] for r in records), max(r["finished_t"] for r in records) + MARGIN_S


def require_attributable(store: Store, session_id: str) -> None:
    """SessionNotFound for an unknown session, InvalidInput (`session`) for one recorded with
    telemetry older than attribution needs."""
    q.require_session(store, session_id)
    require_version(q.steps(store, session_id, limit=1))


def covering_steps(
    store: Store, session_id: str, records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    if not records:
        return []
    t0, t1 = life_span(records)
    return q.all_steps(store, session_id, t0, t1)


def session_timeline(store: Store, session_id: str, req: str) -> dict[str, Any] | None:
    """One ended request's timeline (None when the session has no such request)."""
    require_attributable(store, session_id)
    record = q.request_record(store, session_id, req)
    if record is None:
        return None
    (timeline,) = attribute([record], covering_steps(store, session_id, [record]))
    return {**timeline.as_dict(), "source": "session", "session": session_id}


def session_report(
    store: Store,
    session_id: str,
    t0: float | None = None,
    t1: float | None = None,
    bucket_s: float = BUCKET_S,
    recent: int = RECENT,
) -> dict[str, Any]:
    """The attribution report over the requests that ended between t0 and t1 (either open)."""
    require_attributable(store, session_id)
    records = q.requests(store, session_id, t0, t1)
    out = report(records, covering_steps(store, session_id, records), bucket_s, recent)
    return {**out, "session": session_id, "from": t0, "to": t1}
