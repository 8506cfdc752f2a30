"""PostgreSQL: the schema and its migrations, the shared pool, error classification."""

from storage._errors import classify_database_error
from storage._migrate import apply_migrations
from storage._pool import build_pool

__all__ = ["apply_migrations", "build_pool", "classify_database_error"]
