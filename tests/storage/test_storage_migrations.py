"""Alembic migrations: a new database gets the head revision, one written before Alembic is
upgraded in place with its recordings intact, and one newer than this code is refused."""

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from storage_helpers import pre_alembic_database, request_record, sqlite_path

from cli.main import main
from engine.bus import TelemetryBus
from storage import SCHEMA_VERSION, IncompatibleSchema, Recorder, StorageError, Store
from storage import queries as q
from storage.models import Base
from storage.store import MIGRATIONS

HEAD = "r0002"
META = {"model": "m", "engine_session": "e", "config": {}, "knobs": {}}


def _revision_and_version(url: str) -> tuple[str | None, int]:
    engine = create_engine(url)
    with engine.connect() as conn:
        revision = MigrationContext.configure(conn).get_current_revision()
        version = conn.execute(text("SELECT version FROM moescope_schema")).scalar_one()
    engine.dispose()
    return revision, version


def test_a_new_database_is_the_models_schema_at_the_head_revision(db_url: str) -> None:
    Store(db_url).close()
    assert _revision_and_version(db_url) == (HEAD, SCHEMA_VERSION)
    engine = create_engine(db_url)
    with engine.connect() as conn:
        # what autogenerate would write next: nothing, so the revisions and models agree
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    engine.dispose()


def test_a_database_from_before_alembic_is_upgraded_in_place(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pre_alembic_database(db_url)
    store = Store(db_url)
    assert _revision_and_version(db_url) == (HEAD, SCHEMA_VERSION)
    engine = create_engine(db_url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    engine.dispose()
    (old,) = q.list_sessions(store)
    assert (old["id"], old["steps"], old["requests"]) == ("old", 1, 1)
    assert (old["replica"], old["fleet_run"], old["knobs"]) == (None, None, {"max_num_seqs": 8})
    assert [s["step"] for s in q.steps(store, "old")] == [1]
    assert q.knob_changes(store, "old")[0]["reason"] == "r"
    (req,) = q.requests(store, "old", with_prompts=True)
    assert (req["req"], req["priority"], req["prompt_token_ids"]) == ("r0", 1, None)
    # and it records as a new one does: a fleet replica's session with its prompts
    steps, requests = TelemetryBus(), TelemetryBus()
    rec = Recorder(store, steps, requests)
    rec.start("rep", replica="replica-0", fleet_run="run-1", **META)
    rerun = rec.begin_session(**META)  # a rerun on that replica carries its tags
    requests.publish(request_record("r1", time.time(), 3, 2) | {"prompt_token_ids": [5, 6, 7]})
    assert rec.flush()
    rec.close()
    tagged = q.list_sessions(store, fleet_run="run-1")
    assert {(s["id"], s["replica"]) for s in tagged} == {("rep", "replica-0"), (rerun, "replica-0")}
    assert q.list_sessions(store, replica="nope") == []
    assert len(q.list_sessions(store)) == 3
    (new_req,) = q.requests(store, rerun, with_prompts=True)
    assert new_req["prompt_token_ids"] == [5, 6, 7]
    assert "prompt_token_ids" not in q.requests(store, rerun)[0]
    store.close()
    main(["sessions", "list", "--db", db_url, "--replica", "replica-0", "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert {s["id"] for s in listed} == {"rep", rerun}


def test_what_older_moescopes_added_without_a_version_is_created(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'older.db'}"
    pre_alembic_database(url)
    with sqlite3.connect(sqlite_path(url)) as conn:
        conn.execute("DROP TABLE whatif_scorecard")
        conn.execute("ALTER TABLE knob_changes DROP COLUMN reason")
        conn.execute("ALTER TABLE requests DROP COLUMN priority")
    store = Store(url)
    assert "whatif_scorecard" in inspect(store.engine).get_table_names()
    assert q.knob_changes(store, "old")[0]["reason"] is None
    assert q.requests(store, "old")[0]["priority"] == 0  # none recorded: read as 0
    store.close()


def test_a_database_newer_than_this_code_is_refused(db_url: str) -> None:
    Store(db_url).close()
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'r9999'"))
    engine.dispose()
    for create in (True, False):
        with pytest.raises(IncompatibleSchema, match="revision r9999, newer than") as info:
            Store(db_url, create=create)
        assert HEAD in str(info.value)


def test_another_programs_alembic_database_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('abc123')")
    for create in (True, False):
        with pytest.raises(StorageError, match="not a moescope database"):
            Store(f"sqlite:///{path}", create=create)
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"alembic_version"}


def test_a_database_downgraded_a_revision_is_upgraded_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'down.db'}"
    Store(url).close()
    engine = create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "r0001")
    assert "replica" not in {c["name"] for c in inspect(engine).get_columns("sessions")}
    engine.dispose()
    Store(url).close()
    assert _revision_and_version(url) == (HEAD, SCHEMA_VERSION)


def test_servers_opening_a_new_database_at_once_all_succeed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'race.db'}"
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_it() -> None:
        start.wait()
        try:
            Store(url, timeout_s=30).close()
        except BaseException as exc:  # noqa: BLE001 - collected for the assert below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _revision_and_version(url) == (HEAD, SCHEMA_VERSION)
