"""A request's prompt token ids (kept when asked, so a rerun replays them); a session's fleet
replica and fleet run.

Revision ID: r0002
Revises: r0001
"""

import sqlalchemy as sa
from alembic import op

revision = "r0002"
down_revision = "r0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("prompt_token_ids", sa.JSON))
    op.add_column("sessions", sa.Column("replica", sa.String(100)))
    op.add_column("sessions", sa.Column("fleet_run", sa.String(100)))
    op.create_index("ix_sessions_fleet_run", "sessions", ["fleet_run"])


def downgrade() -> None:
    op.drop_index("ix_sessions_fleet_run", "sessions")
    # SQLite drops a column by copying the table: batch mode does that where it must
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("fleet_run")
        batch.drop_column("replica")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("prompt_token_ids")
