"""Tools to prove your own workflows durable: the effect-owner service (``owner``), the kill
harness (``kill``), the store conformance suite (``conformance``) — and ``forget_workflows``."""

from __future__ import annotations

from .._engine.workflow import forget_workflows

__all__ = ["forget_workflows"]
