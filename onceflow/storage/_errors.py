"""Classifies database failures into outcome classes, once, for every activity."""

import psycopg
from psycopg import errors
from psycopg_pool import PoolTimeout

from onceflow.retry_policy import OutcomeClass

_ROLLED_BACK = (
    errors.SerializationFailure,
    errors.DeadlockDetected,
    errors.LockNotAvailable,
)


def classify_database_error(error: BaseException) -> tuple[OutcomeClass, str]:
    """The outcome class of a failed database call and a reason safe to show.

    A connection lost mid-call is ``unknown``: the commit may have landed. Whether a
    repeat is then safe is the tool's dedupe strategy's business, not this function's.
    """
    if isinstance(error, PoolTimeout):
        return OutcomeClass.TRANSIENT, "no database connection was available"
    if isinstance(error, _ROLLED_BACK):
        return OutcomeClass.TRANSIENT, f"the transaction was rolled back ({error.sqlstate})"
    if isinstance(error, psycopg.IntegrityError | psycopg.DataError):
        return OutcomeClass.REJECTED, f"the database refused the write ({error.sqlstate})"
    if isinstance(error, psycopg.OperationalError):
        return OutcomeClass.UNKNOWN, "the database connection failed; the commit may have landed"
    return OutcomeClass.UNKNOWN, f"unexpected database failure ({type(error).__name__})"
