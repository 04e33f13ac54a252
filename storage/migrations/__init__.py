"""Alembic schema migrations, run by `storage.store.Store` when it opens a database.

A schema change is a new module in versions/ whose `down_revision` is the current head, with
the matching change to storage/models.py. A revision only adds (nullable columns, tables,
indexes), so an older database upgrades in place and its recordings stay readable.
"""
