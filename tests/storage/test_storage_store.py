"""Opening a database: schema creation, WAL mode, and the schema version check."""

import sqlite3
from pathlib import Path

import pytest

from cli.main import main
from storage import SCHEMA_VERSION, IncompatibleSchema, StorageError, Store


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def test_first_open_creates_the_schema_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    Store(_url(path)).close()
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"moescope_schema", "sessions", "steps", "knob_changes", "requests"} <= tables
    assert conn.execute("SELECT version FROM moescope_schema").fetchall() == [(SCHEMA_VERSION,)]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    Store(_url(path), create=False).close()  # reopens without complaint


def test_another_schema_version_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    Store(_url(path)).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE moescope_schema SET version = 999")
    for create in (True, False):
        with pytest.raises(IncompatibleSchema) as info:
            Store(_url(path), create=create)
        msg = str(info.value)
        assert "version 999" in msg and f"reads version {SCHEMA_VERSION}" in msg
        assert str(path) in msg
    with pytest.raises(SystemExit) as exit_info:
        main(["sessions", "list", "--db", _url(path)])
    assert "version 999" in str(exit_info.value)


def test_unversioned_moescope_tables_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE steps (id INTEGER)")
    with pytest.raises(IncompatibleSchema, match="no schema version"):
        Store(_url(path))


def test_readers_do_not_create_databases(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(StorageError, match="no such file"):
        Store(_url(path), create=False)
    assert not path.exists()
    with pytest.raises(SystemExit) as info:
        main(["sessions", "show", "abc", "--db", _url(path)])
    assert "no database" in str(info.value)
    with pytest.raises(StorageError, match="bad database URL"):
        Store("nonsense://")
