"""moescope storage: SQLAlchemy models, the background recorder, session queries and replay."""

from storage.models import SCHEMA_VERSION
from storage.recorder import Recorder
from storage.store import (
    DEFAULT_URL,
    IncompatibleSchema,
    SessionNotFound,
    SessionOpen,
    StorageError,
    Store,
)

__all__ = [
    "DEFAULT_URL",
    "SCHEMA_VERSION",
    "IncompatibleSchema",
    "Recorder",
    "SessionNotFound",
    "SessionOpen",
    "StorageError",
    "Store",
]
