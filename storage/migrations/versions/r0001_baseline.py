"""The schema as the last moescope before Alembic made it (moescope_schema version 1).

A database made before Alembic has these tables already, but may lack what was added to
them without a version bump (the what-if scorecard table, a knob change's reason, a request's
priority): this revision creates the missing tables and those nullable columns, so every such
database reaches the same starting point.

Revision ID: r0001
Revises: (none)
"""

import sqlalchemy as sa
from alembic import op

revision = "r0001"
down_revision = None
branch_labels = None
depends_on = None


def _schema() -> sa.MetaData:
    meta = sa.MetaData()
    sa.Table(
        "moescope_schema",
        meta,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_t", sa.Double, nullable=False),
    )
    sa.Table(
        "sessions",
        meta,
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("label", sa.String(200)),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("parent_id", sa.String(40), index=True),
        sa.Column("model", sa.String(500), nullable=False),
        sa.Column("engine_session", sa.String(40), nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("knobs", sa.JSON, nullable=False),
        sa.Column("knobs_version", sa.Integer, nullable=False),
        sa.Column("started_t", sa.Double, nullable=False, index=True),
        sa.Column("ended_t", sa.Double),
        sa.Column("dropped", sa.Integer, nullable=False),
    )
    sa.Table(
        "steps",
        meta,
        sa.Column("session_id", sa.String(40), sa.ForeignKey("sessions.id"), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("t", sa.Double, nullable=False),
        sa.Column("knobs_version", sa.Integer, nullable=False),
        sa.Column("dur_ms", sa.Double, nullable=False),
        sa.Column("running", sa.Integer, nullable=False),
        sa.Column("waiting", sa.Integer, nullable=False),
        sa.Column("num_tokens", sa.Integer, nullable=False),
        sa.Column("kv_used", sa.Integer, nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
        sa.Index("ix_steps_session_t", "session_id", "t"),
    )
    sa.Table(
        "knob_changes",
        meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "session_id", sa.String(40), sa.ForeignKey("sessions.id"), nullable=False, index=True
        ),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("t", sa.Double, nullable=False),
        sa.Column("origin", sa.String(64), nullable=False),
        sa.Column("changes", sa.JSON, nullable=False),
        sa.Column("reason", sa.String(2000)),
    )
    sa.Table(
        "requests",
        meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "session_id", sa.String(40), sa.ForeignKey("sessions.id"), nullable=False, index=True
        ),
        sa.Column("req", sa.String(100), nullable=False),
        sa.Column("arrival", sa.Double, nullable=False),
        sa.Column("finished_t", sa.Double, nullable=False),
        sa.Column("prompt_len", sa.Integer, nullable=False),
        sa.Column("output_len", sa.Integer, nullable=False),
        sa.Column("max_tokens", sa.Integer, nullable=False),
        sa.Column("ttft_ms", sa.Double),
        sa.Column("e2e_ms", sa.Double, nullable=False),
        sa.Column("finish_reason", sa.String(16), nullable=False),
        sa.Column("preemptions", sa.Integer, nullable=False),
        sa.Column("priority", sa.Integer),
    )
    sa.Table(
        "whatif_scorecard",
        meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(40), nullable=False, index=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("t", sa.Double, nullable=False, index=True),
        sa.Column("origin", sa.String(64), nullable=False),
        sa.Column("changes", sa.JSON, nullable=False),
        sa.Column("horizon_s", sa.Double, nullable=False),
        sa.Column("predicted", sa.JSON),
        sa.Column("reason", sa.String(2000)),
        sa.Column("observed", sa.JSON),
        sa.Column("errors", sa.JSON),
        sa.Column("observed_t", sa.Double),
    )
    return meta


def upgrade() -> None:
    bind = op.get_bind()
    found = sa.inspect(bind)
    have = set(found.get_table_names())
    for table in _schema().sorted_tables:
        if table.name not in have:
            table.create(bind)
            continue
        columns = {c["name"] for c in found.get_columns(table.name)}
        for column in table.columns:
            if column.name not in columns:
                assert column.nullable, f"{table.name}.{column.name} was never added later"
                op.add_column(table.name, sa.Column(column.name, column.type))


def downgrade() -> None:
    _schema().drop_all(op.get_bind())
