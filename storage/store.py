"""Opening a database: engine options (SQLite in WAL mode), its schema made or upgraded by the
Alembic revisions in storage/migrations, and the refusal of a database newer than this code."""

import functools
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, insert, inspect, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from storage.models import SCHEMA_VERSION, Base, SchemaInfo

DEFAULT_URL = "sqlite:///moescope.db"
MIGRATIONS = Path(__file__).with_name("migrations")
ALEMBIC_TABLE = "alembic_version"
PRE_ALEMBIC_VERSION = 1  # create_all made it; the baseline revision r0001 takes it over
# Alembic keeps the running migration in module globals (alembic.context, alembic.op): one at
# a time in a process. Other processes are another matter (see Store._upgrade).
_UPGRADING = threading.Lock()
_dumps = functools.partial(json.dumps, separators=(",", ":"))


class StorageError(RuntimeError):
    """The database cannot be used (missing, unreachable, or not a moescope database)."""


class IncompatibleSchema(StorageError):
    """The database was written by a moescope with another schema version."""


class SessionNotFound(KeyError):
    """No session with this id."""

    def __str__(self) -> str:
        return f"no session {self.args[0]!r}"


class SessionOpen(RuntimeError):
    """The session has no end time: a server may still be recording it."""

    def __str__(self) -> str:
        return f"session {self.args[0]!r} is still open (no end time): a server may be recording it"


def safe_url(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot parse is reported as given
        return url


def make_engine(url: str, timeout_s: float = 5.0) -> Engine:
    """An engine for `url`; SQLite files get WAL, synchronous=NORMAL and a busy timeout."""
    parsed = make_url(url)
    kwargs: dict[str, Any] = {"json_serializer": _dumps}
    if parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": timeout_s}
    else:
        kwargs["pool_pre_ping"] = True  # a server may have restarted since the last use
    if parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": max(1, round(timeout_s))}
    engine = create_engine(url, **kwargs)
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", functools.partial(_sqlite_pragmas, timeout_s))
    return engine


def _sqlite_pragmas(timeout_s: float, dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # Switching to WAL takes an exclusive lock and SQLite answers BUSY at once rather than wait
    # on the busy timeout: when several servers open a new database together, all but one try
    # again until the first has switched it (then the pragma is a no-op) or the timeout passes.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


class Store:
    """A moescope database: creates the schema, or upgrades an older one, when opened.

    `create=False` opens an existing database only (for readers such as the command line); an
    older one is upgraded all the same, since the queries read the newest columns.
    Raises IncompatibleSchema for a database newer than this code (or not versioned) and
    StorageError when the database cannot be reached or opened.
    """

    def __init__(self, url: str = DEFAULT_URL, create: bool = True, timeout_s: float = 5.0) -> None:
        self.url = url
        self.display_url = safe_url(url)
        try:
            parsed = make_url(url)
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy raises several kinds here
            raise StorageError(f"bad database URL {url!r}: {exc}") from None
        path = parsed.database
        is_file = parsed.get_backend_name() == "sqlite" and path not in (None, "", ":memory:")
        if path and is_file and not create and not Path(path).is_file():
            raise StorageError(f"no database at {self.display_url} (no such file)")
        try:
            self.engine = make_engine(url, timeout_s)
        except (SQLAlchemyError, ImportError) as exc:
            raise StorageError(f"bad database URL {self.display_url}: {exc}") from None
        try:
            self._check_schema(create)
        except SQLAlchemyError as exc:
            self.engine.dispose()
            raise StorageError(f"cannot open {self.display_url}: {_first_line(exc)}") from None
        except StorageError:
            self.engine.dispose()
            raise

    def _check_schema(self, create: bool) -> None:
        tables = set(inspect(self.engine).get_table_names())
        if SchemaInfo.__tablename__ not in tables and ALEMBIC_TABLE not in tables:
            ours = sorted(tables & set(Base.metadata.tables))
            if ours:
                raise IncompatibleSchema(
                    f"{self.display_url} has moescope tables ({', '.join(ours)}) but no schema "
                    f"version: it was written by an older moescope. This moescope reads schema "
                    f"version {SCHEMA_VERSION}; use another --db or move that database away."
                )
            if not create:
                raise StorageError(f"{self.display_url} is not a moescope database")
        version, heads = self._versions()
        if version not in (None, PRE_ALEMBIC_VERSION, SCHEMA_VERSION):
            raise IncompatibleSchema(
                f"{self.display_url} has moescope schema version {version}, but this moescope "
                f"reads version {SCHEMA_VERSION}. Use another --db, or read that database with "
                f"the moescope version that wrote it."
            )
        script = ScriptDirectory(str(MIGRATIONS))
        newer = heads - {s.revision for s in script.walk_revisions()}
        if newer and version is None:
            raise StorageError(
                f"{self.display_url} is not a moescope database (another program's Alembic "
                f"revision {', '.join(sorted(newer))})"
            )
        if newer:
            raise IncompatibleSchema(
                f"{self.display_url} has schema revision {', '.join(sorted(newer))}, newer "
                f"than this moescope knows (up to {script.get_current_head()}). Use another "
                f"--db, or read that database with the moescope version that wrote it."
            )
        if version != SCHEMA_VERSION or heads != {script.get_current_head()}:
            self._upgrade(script)

    def _versions(self) -> tuple[int | None, set[str]]:
        """The moescope_schema version (None: no row) and the Alembic revisions applied."""
        with self.engine.connect() as conn:
            heads = set(MigrationContext.configure(conn).get_current_heads())
            if SchemaInfo.__tablename__ not in inspect(conn).get_table_names():
                return None, heads
            version = conn.execute(select(SchemaInfo.version).where(SchemaInfo.id == 1)).scalar()
        return version, heads

    def _upgrade(self, script: ScriptDirectory) -> None:
        """Create a new database, or bring an older one (from before Alembic too) to the head
        revision, in place: revisions only add, so what was recorded stays readable."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
        try:
            with _UPGRADING, self.engine.begin() as conn:
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
                marked = conn.execute(
                    update(SchemaInfo).where(SchemaInfo.id == 1).values(version=SCHEMA_VERSION)
                )
                if marked.rowcount == 0:
                    conn.execute(
                        insert(SchemaInfo).values(
                            id=1, version=SCHEMA_VERSION, created_t=time.time()
                        )
                    )
        except SQLAlchemyError:
            # another process may have made or upgraded it at the same moment: fine if so
            if self._versions() != (SCHEMA_VERSION, {script.get_current_head()}):
                raise

    def close(self) -> None:
        self.engine.dispose()


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0] if text else type(exc).__name__
