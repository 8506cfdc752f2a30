"""Fixtures of the workflow tests: the scripted tools and a worker that runs them."""

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.tools.worker import CATALOGUE, Catalogue
from onceflow.workflows import AgentTaskWorkflow

from .scripted_tools import Script, register_scripted_tools


@pytest.fixture
def script() -> Script:
    """A fresh script, with the scripted tools in the catalogue."""
    register_scripted_tools()
    return Script()


def scripted_worker(
    env: WorkflowEnvironment, task_queue: str, script: Script, catalogue: Catalogue = CATALOGUE
) -> Worker:
    """A worker (not yet started) running the task workflow and the scripted tools, its
    tools' contracts those of ``catalogue`` (default the process's)."""
    return Worker(
        env.client,
        task_queue=task_queue,
        workflows=[AgentTaskWorkflow],
        activities=script.activities(catalogue),
    )
