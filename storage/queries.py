"""Reading sessions back: lists, summaries, steps in a range, knob changes, requests; edits."""

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Row, delete, func, select, update
from sqlalchemy.orm import Session

from stats import QUANTILES, summary
from storage.models import (
    REQUEST_FIELDS,
    KnobChangeRow,
    RequestRow,
    ScorecardRow,
    SessionRow,
    StepRow,
)
from storage.store import SessionNotFound, SessionOpen, Store

MAX_STEPS_PER_QUERY = 10_000


def _session_query() -> Any:
    steps = (
        select(
            StepRow.session_id,
            func.count().label("steps"),
            func.min(StepRow.step).label("first_step"),
            func.max(StepRow.step).label("last_step"),
            func.min(StepRow.t).label("first_t"),
            func.max(StepRow.t).label("last_t"),
        )
        .group_by(StepRow.session_id)
        .subquery()
    )
    requests = (
        select(RequestRow.session_id, func.count().label("requests"))
        .group_by(RequestRow.session_id)
        .subquery()
    )
    return (
        select(
            SessionRow,
            steps.c.steps,
            steps.c.first_step,
            steps.c.last_step,
            steps.c.first_t,
            steps.c.last_t,
            requests.c.requests,
        )
        .outerjoin(steps, steps.c.session_id == SessionRow.id)
        .outerjoin(requests, requests.c.session_id == SessionRow.id)
    )


def _session_dict(row: Row[Any]) -> dict[str, Any]:
    s: SessionRow = row[0]
    end = s.ended_t if s.ended_t is not None else row.last_t
    return {
        "id": s.id,
        "label": s.label,
        "kind": s.kind,
        "parent": s.parent_id,
        "model": s.model,
        "engine_session": s.engine_session,
        "started_t": s.started_t,
        "ended_t": s.ended_t,
        "duration_s": round(max(0.0, end - s.started_t), 3) if end is not None else 0.0,
        "steps": row.steps or 0,
        "first_step": row.first_step,
        "last_step": row.last_step,
        "requests": row.requests or 0,
        "dropped": s.dropped,
        "knobs": s.knobs,
        "knobs_version": s.knobs_version,
        "replica": s.replica,
        "fleet_run": s.fleet_run,
    }


def list_sessions(
    store: Store,
    limit: int = 100,
    offset: int = 0,
    *,
    replica: str | None = None,
    fleet_run: str | None = None,
) -> list[dict[str, Any]]:
    """Newest first: id, label, kind, parent, model, duration, steps, requests, knobs at start,
    fleet replica and run; only those of `replica` and of `fleet_run` when given."""
    query = _session_query()
    if replica is not None:
        query = query.where(SessionRow.replica == replica)
    if fleet_run is not None:
        query = query.where(SessionRow.fleet_run == fleet_run)
    query = query.order_by(SessionRow.started_t.desc()).limit(limit).offset(offset)
    with Session(store.engine) as conn:
        return [_session_dict(r) for r in conn.execute(query)]


def get_session(store: Store, session_id: str) -> dict[str, Any]:
    """One session's list entry plus config, reruns, knob change count and request stats."""
    with Session(store.engine) as conn:
        row = conn.execute(_session_query().where(SessionRow.id == session_id)).first()
        if row is None:
            raise SessionNotFound(session_id)
        out = _session_dict(row)
        out["config"] = row[0].config
        out["reruns"] = list(
            conn.execute(
                select(SessionRow.id)
                .where(SessionRow.parent_id == session_id)
                .order_by(SessionRow.started_t)
            ).scalars()
        )
        out["knob_changes"] = conn.execute(
            select(func.count()).where(KnobChangeRow.session_id == session_id)
        ).scalar()
        mean_ms = conn.execute(
            select(func.avg(StepRow.dur_ms)).where(StepRow.session_id == session_id)
        ).scalar()
        reqs = conn.execute(
            select(
                RequestRow.finish_reason,
                RequestRow.prompt_len,
                RequestRow.output_len,
                RequestRow.ttft_ms,
            ).where(RequestRow.session_id == session_id)
        ).all()
    out["mean_step_ms"] = round(mean_ms, 3) if mean_ms is not None else None
    out["request_stats"] = _request_stats(reqs)
    return out


def _request_stats(reqs: Sequence[Row[str, int, int, float | None]]) -> dict[str, Any]:
    """Finish reasons, token counts and TTFT percentiles (`stats.summary`, None without any)."""
    reasons: dict[str, int] = {}
    for r in reqs:
        reasons[r.finish_reason] = reasons.get(r.finish_reason, 0) + 1
    ttft = summary(r.ttft_ms for r in reqs if r.ttft_ms is not None)
    return {
        "finish_reasons": reasons,
        "prompt_tokens": sum(r.prompt_len for r in reqs),
        "output_tokens": sum(r.output_len for r in reqs),
        **{
            f"ttft_ms_p{q}": None if (v := ttft[f"p{q}"]) is None else round(v, 3)
            for q in QUANTILES
        },
    }


def require_session(store: Store, session_id: str) -> None:
    """Raise SessionNotFound unless the session exists."""
    with Session(store.engine) as conn:
        if conn.execute(select(SessionRow.id).where(SessionRow.id == session_id)).first() is None:
            raise SessionNotFound(session_id)


def steps(
    store: Store,
    session_id: str,
    start: int | None = None,
    end: int | None = None,
    limit: int = MAX_STEPS_PER_QUERY,
    every: int = 1,
    t0: float | None = None,
    t1: float | None = None,
) -> list[dict[str, Any]]:
    """Telemetry records with start <= step <= end and t0 <= t <= t1 (any open), in step order."""
    query = select(StepRow.data).where(StepRow.session_id == session_id)
    if start is not None:
        query = query.where(StepRow.step >= start)
    if end is not None:
        query = query.where(StepRow.step <= end)
    if t0 is not None:
        query = query.where(StepRow.t >= t0)
    if t1 is not None:
        query = query.where(StepRow.t <= t1)
    if every > 1:
        query = query.where(StepRow.step % every == 0)
    with Session(store.engine) as conn:
        return list(conn.execute(query.order_by(StepRow.step).limit(limit)).scalars())


def iter_steps(
    store: Store, session_id: str, t0: float | None = None, t1: float | None = None
) -> Iterator[dict[str, Any]]:
    """Every telemetry record of a session (with t0 <= t <= t1, either open) in step order,
    read a page at a time (memory holds one page)."""
    start = None
    while True:
        page = steps(store, session_id, start, t0=t0, t1=t1)
        yield from page
        if len(page) < MAX_STEPS_PER_QUERY:
            return
        start = page[-1]["step"] + 1


def all_steps(
    store: Store, session_id: str, t0: float | None = None, t1: float | None = None
) -> list[dict[str, Any]]:
    """`iter_steps` as a list."""
    return list(iter_steps(store, session_id, t0, t1))


def recording(
    store: Store, session_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """A session's summary (with its config and knobs), all its steps and its request records,
    as the what-if twin takes them; SessionNotFound for an unknown id."""
    return get_session(store, session_id), all_steps(store, session_id), requests(store, session_id)


def knob_changes(store: Store, session_id: str) -> list[dict[str, Any]]:
    """Applied knob changes in order: step, version, t, origin, {knob: [old, new]}, reason."""
    query = (
        select(KnobChangeRow)
        .where(KnobChangeRow.session_id == session_id)
        .order_by(KnobChangeRow.step, KnobChangeRow.version)
    )
    with Session(store.engine) as conn:
        return [
            {
                "step": k.step,
                "version": k.version,
                "t": k.t,
                "origin": k.origin,
                "changes": k.changes,
                "reason": k.reason,
            }
            for (k,) in conn.execute(query)
        ]


def requests(
    store: Store,
    session_id: str,
    ended_from: float | None = None,
    ended_to: float | None = None,
    with_prompts: bool = False,
) -> list[dict[str, Any]]:
    """Request records (those that ended between ended_from and ended_to, either open) in
    arrival order; `with_prompts` adds each one's `prompt_token_ids` (None where not kept)."""
    query = select(RequestRow).where(RequestRow.session_id == session_id)
    if ended_from is not None:
        query = query.where(RequestRow.finished_t >= ended_from)
    if ended_to is not None:
        query = query.where(RequestRow.finished_t <= ended_to)
    with Session(store.engine) as conn:
        rows = conn.execute(query.order_by(RequestRow.arrival, RequestRow.id))
        if with_prompts:
            return [_request_dict(r) | {"prompt_token_ids": r.prompt_token_ids} for (r,) in rows]
        return [_request_dict(r) for (r,) in rows]


def request_record(store: Store, session_id: str, req: str) -> dict[str, Any] | None:
    """The record of request `req` (the one that ended last, should an id have been reused)."""
    query = (
        select(RequestRow)
        .where(RequestRow.session_id == session_id, RequestRow.req == req)
        .order_by(RequestRow.finished_t.desc())
        .limit(1)
    )
    with Session(store.engine) as conn:
        row = conn.execute(query).scalar()
        return None if row is None else _request_dict(row)


def _request_dict(r: RequestRow) -> dict[str, Any]:
    """A RequestRecord dict (a session recorded before priorities has them as 0)."""
    return {f: getattr(r, f) for f in REQUEST_FIELDS} | {"priority": r.priority or 0}


def delete_session(store: Store, session_id: str, only_ended: bool = False) -> None:
    """Remove a session and everything recorded in it; its reruns lose their parent link.

    With `only_ended`, a session that has no end time yet raises SessionOpen instead (checked
    before the write: a session that has ended never reopens).
    """
    if only_ended:
        with Session(store.engine) as conn:
            row = conn.execute(
                select(SessionRow.ended_t).where(SessionRow.id == session_id)
            ).first()
        if row is None:
            raise SessionNotFound(session_id)
        if row.ended_t is None:
            raise SessionOpen(session_id)
    with store.engine.begin() as conn:
        for table in (StepRow, KnobChangeRow, RequestRow, ScorecardRow):
            conn.execute(delete(table).where(table.session_id == session_id))
        conn.execute(
            update(SessionRow).where(SessionRow.parent_id == session_id).values(parent_id=None)
        )
        if conn.execute(delete(SessionRow).where(SessionRow.id == session_id)).rowcount == 0:
            raise SessionNotFound(session_id)


def set_label(store: Store, session_id: str, label: str | None) -> None:
    with store.engine.begin() as conn:
        result = conn.execute(
            update(SessionRow).where(SessionRow.id == session_id).values(label=label)
        )
        if result.rowcount == 0:
            raise SessionNotFound(session_id)
