"""Deterministic workflow code: ``AgentTaskWorkflow`` and its public models."""

from onceflow.workflows.agent_task import AgentTaskWorkflow

__all__ = ["AgentTaskWorkflow"]
