"""An activity environment for running one tool attempt outside a worker."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from temporalio.testing import ActivityEnvironment


def attempt_environment(timeout: timedelta = timedelta(minutes=1)) -> ActivityEnvironment:
    """An ``ActivityEnvironment`` whose attempt started now with ``timeout`` to run, as
    a worker's would (the SDK's default started at the epoch with one second, which the
    tool API takes for an attempt Temporal gave up long ago)."""
    env = ActivityEnvironment()
    env.info = replace(env.info, started_time=datetime.now(UTC), start_to_close_timeout=timeout)
    return env
