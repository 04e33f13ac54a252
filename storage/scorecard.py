"""The what-if scorecard table: a prediction per applied knob change, its observation later."""

from typing import Any

from sqlalchemy import insert, select, update

from storage.models import ScorecardRow
from storage.store import Store

FIELDS = ("version", "t", "origin", "changes", "horizon_s", "predicted", "reason")
OBSERVED = ("observed", "errors", "observed_t")


def add_prediction(store: Store, entry: dict[str, Any]) -> int:
    """Store a scorecard entry (`session` and FIELDS) before its observation; its row id."""
    values = {k: entry[k] for k in FIELDS}
    with store.engine.begin() as conn:
        key = conn.execute(
            insert(ScorecardRow).values(session_id=entry["session"], **values)
        ).inserted_primary_key
    assert key is not None
    return int(key[0])


def add_observation(store: Store, entry_id: int, entry: dict[str, Any]) -> None:
    """Store an entry's observation (its OBSERVED fields)."""
    with store.engine.begin() as conn:
        conn.execute(
            update(ScorecardRow)
            .where(ScorecardRow.id == entry_id)
            .values(**{k: entry[k] for k in OBSERVED})
        )


def entries(store: Store, limit: int = 50) -> list[dict[str, Any]]:
    """Scorecard entries of every session, newest first."""
    table = ScorecardRow.__table__
    query = select(table).order_by(table.c.t.desc(), table.c.id.desc())
    with store.engine.connect() as conn:
        rows = conn.execute(query.limit(limit)).mappings().all()
    return [{"session": r["session_id"], **{k: r[k] for k in (*FIELDS, *OBSERVED)}} for r in rows]
