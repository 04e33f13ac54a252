"""Alembic's environment: runs the revisions over the connection that storage.store hands it."""

from alembic import context

from storage.models import Base

context.configure(connection=context.config.attributes["connection"], target_metadata=Base.metadata)
with context.begin_transaction():
    context.run_migrations()
