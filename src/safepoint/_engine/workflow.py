"""The names the facade and ``safepoint.testing`` import from here: the workflow type and its
registry (``registry``) and the run lifecycle (``lifecycle``), re-exported so that those imports
stay as they are."""

from .lifecycle import (
    cancel,
    cancel_async,
    resume,
    resume_async,
    start,
    start_async,
    submit,
    submit_async,
)
from .registry import Workflow, forget_workflows, workflow

__all__ = ["Workflow", "cancel", "cancel_async", "forget_workflows", "resume", "resume_async",
           "start", "start_async", "submit", "submit_async", "workflow"]
