"""SQLAlchemy 2 ORM models: sessions, steps, knob_changes, requests, the what-if scorecard and
the schema version. A change here goes with a revision in storage/migrations/versions."""

from typing import Any

from sqlalchemy import JSON, Double, ForeignKey, Index, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# 1: made by create_all before Alembic; 2: Alembic revisions (the alembic_version table) say
# the rest, so a moescope from before Alembic refuses a database it has not seen
SCHEMA_VERSION = 2


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, float: Double}


class SchemaInfo(Base):
    """One row: the schema version this database was written with."""

    __tablename__ = "moescope_schema"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int]
    created_t: Mapped[float]


class SessionRow(Base):
    """One recorded run of the server (`kind` server) or a rerun of one (`kind` rerun)."""

    __tablename__ = "sessions"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    label: Mapped[str | None] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    parent_id: Mapped[str | None] = mapped_column(String(40), index=True)
    model: Mapped[str] = mapped_column(String(500))
    engine_session: Mapped[str] = mapped_column(String(40))
    config: Mapped[dict[str, Any]]
    knobs: Mapped[dict[str, Any]]
    knobs_version: Mapped[int]
    started_t: Mapped[float] = mapped_column(index=True)
    ended_t: Mapped[float | None]
    dropped: Mapped[int] = mapped_column(default=0)
    replica: Mapped[str | None] = mapped_column(String(100))  # a fleet's replica id
    fleet_run: Mapped[str | None] = mapped_column(String(100), index=True)  # one `fleet` start


class StepRow(Base):
    """One StepTelemetry record (`data`) with the columns that queries filter and sort on."""

    __tablename__ = "steps"
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), primary_key=True)
    step: Mapped[int] = mapped_column(primary_key=True)
    t: Mapped[float]
    knobs_version: Mapped[int]
    dur_ms: Mapped[float]
    running: Mapped[int]
    waiting: Mapped[int]
    num_tokens: Mapped[int]
    kv_used: Mapped[int]
    data: Mapped[dict[str, Any]]

    __table_args__ = (Index("ix_steps_session_t", "session_id", "t"),)


class KnobChangeRow(Base):
    """One applied knob change: the step it took effect at, version, time, origin, diff."""

    __tablename__ = "knob_changes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    step: Mapped[int]
    version: Mapped[int]
    t: Mapped[float]
    origin: Mapped[str] = mapped_column(String(64))
    changes: Mapped[dict[str, Any]]
    reason: Mapped[str | None] = mapped_column(String(2000), default=None)


class RequestRow(Base):
    """One request's life: arrival, lengths, TTFT, end-to-end time and finish reason."""

    __tablename__ = "requests"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    req: Mapped[str] = mapped_column(String(100))
    arrival: Mapped[float]
    finished_t: Mapped[float]
    prompt_len: Mapped[int]
    output_len: Mapped[int]
    max_tokens: Mapped[int]
    ttft_ms: Mapped[float | None]
    e2e_ms: Mapped[float]
    finish_reason: Mapped[str] = mapped_column(String(16))
    preemptions: Mapped[int]
    priority: Mapped[int | None]  # None in sessions recorded before it was
    # kept with `serve --record-prompts`, so a rerun replays the same tokens
    prompt_token_ids: Mapped[list[int] | None] = mapped_column(JSON)


# the columns a RequestRecord fills (all but the row id and the session)
REQUEST_FIELDS = (
    "req",
    "arrival",
    "finished_t",
    "prompt_len",
    "output_len",
    "max_tokens",
    "ttft_ms",
    "e2e_ms",
    "finish_reason",
    "preemptions",
    "priority",
)


class ScorecardRow(Base):
    """One applied knob change scored: the live twin's prediction when it applied (or why there
    was none) and, once its horizon passed, what was observed, with each metric's error.

    `session_id` has no foreign key: a server that does not record its session still scores."""

    __tablename__ = "whatif_scorecard"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(40), index=True)
    version: Mapped[int]
    t: Mapped[float] = mapped_column(index=True)
    origin: Mapped[str] = mapped_column(String(64))
    changes: Mapped[dict[str, Any]]
    horizon_s: Mapped[float]
    predicted: Mapped[dict[str, Any] | None]
    reason: Mapped[str | None] = mapped_column(String(2000))
    observed: Mapped[dict[str, Any] | None]
    errors: Mapped[dict[str, Any] | None]
    observed_t: Mapped[float | None]
