"""PostgreSQL: the schema and its migrations, the shared pool, error classification."""

from onceflow.storage._errors import classify_database_error
from onceflow.storage._migrate import RETIRED_MIGRATIONS, SchemaStatus, apply_migrations
from onceflow.storage._pool import autocommit, build_pool

__all__ = [
    "RETIRED_MIGRATIONS",
    "SchemaStatus",
    "apply_migrations",
    "autocommit",
    "build_pool",
    "classify_database_error",
]
