"""What the engine computes of a step's record: its input hash, and the next step a decision's
value names (records are copied with ``_rules.records.revised``)."""

from __future__ import annotations

from typing import Any

from .._rules.canonical import canonical_if_json, checked_canonical, require_json, sha256_hex
from .._rules.secrets import hashed_form
from ..errors import InvalidDecision
from ..types import JSON


def next_step_id(sid: str, value: JSON) -> str:
    """The step a decision step's value names next (a str, or a dict with ``next_step_id``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("next_step_id"), str):
        return str(value["next_step_id"])
    raise InvalidDecision(sid, f"a {type(value).__name__}")


def input_hash(inputs: Any, sid: str) -> str:
    """sha256 of a step's inputs as their hash covers them (``hashed_form``: Secrets masked,
    Transcripts by reference). Most inputs hold neither, and are encoded as they are in one
    walk; only the others are copied into their hashed form first."""
    encoded = canonical_if_json(inputs, allow_tuples=True)
    if encoded is None:
        try:
            shaped = hashed_form(inputs)
        except RecursionError:  # nested too deep, or containing itself: say where
            require_json(inputs, "inputs", sid, allow_tuples=True)
            raise
        encoded = checked_canonical(shaped, "inputs", sid, allow_tuples=True)
    return sha256_hex(encoded)
