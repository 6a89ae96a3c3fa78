"""Workflow compatibility: may this code continue a run another deploy recorded?

A run remembers what the code that started it was built from: the workflow's name and explicit
version, and a **fingerprint** — a digest over the tool schemas it offers its model, the model
ids it calls and the hashes of its prompts. Those three are what make a recorded model answer a
reply to *this* question; when they move, replaying old answers into new code is a guess.

The parts are kept as digests in a small **manifest** beside the fingerprint, so a refusal can
say which tool, model or prompt changed. Nothing here reads source code: a version bump or a
prompt edit is a decision the author states (a source hash would strand every run on every
deploy).

What happens on a difference is the workflow's compatibility policy: ``refuse`` (block with the
recovery record) or ``replan`` (continue under the new code; see ``RunCore`` for how the stale
tail of recorded steps is abandoned while the effect ledger is kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import UsageError
from ..types import JSON, StepRecord
from .canonical import canonical, digest, input_hash, require_json
from .kinds import KINDS
from .secrets import refuse_secrets


def manifest_of(
    tools: JSON = None, models: Iterable[str] | None = None, prompts: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The parts of a fingerprint, each as a digest: ``{"tools": {name: digest},
    "models": [id, …], "prompts": {name: digest}}``.

    ``tools`` are the tool schemas offered to the model: a list of schemas that carry their
    ``name`` (Anthropic style) or ``function.name`` (OpenAI style), or a mapping name → schema.
    ``prompts`` maps a prompt's name to its text; only the text's digest is kept.
    """
    tool_digests: dict[str, str] = {}
    for name, schema in _named_tools(tools):
        require_json(schema, f"tool schema {name!r}")
        refuse_secrets(schema, f"tool schema {name!r}")
        tool_digests[name] = digest(canonical(schema))
    model_ids = sorted({_text(model, "a model id") for model in (models or ())})
    prompt_digests = {
        _text(name, "a prompt name"): digest(_text(text, "a prompt").encode())
        for name, text in (prompts or {}).items()
    }
    return {
        "tools": dict(sorted(tool_digests.items())),
        "models": model_ids,
        "prompts": dict(sorted(prompt_digests.items())),
    }


def fingerprint(manifest: Mapping[str, Any]) -> str:
    """One digest over the manifest (RFC 8785 canonical JSON, sha256)."""
    return input_hash(dict(manifest))


def changes(
    recorded_version: str,
    recorded_manifest: Mapping[str, Any] | None,
    recorded_fingerprint: str | None,
    version: str,
    manifest: Mapping[str, Any],
    fingerprint_now: str,
) -> list[str]:
    """What differs between the code that recorded a run and this code, in words; empty when
    this code may continue it as it is. A run recorded before fingerprints existed (None) is
    compared by version only."""
    found = []
    if recorded_version != version:
        found.append(f"version {recorded_version!r} became {version!r}")
    if recorded_fingerprint is None or recorded_fingerprint == fingerprint_now:
        return found
    before = recorded_manifest or {}
    for part, label in (("tools", "tool"), ("prompts", "prompt")):
        old, new = dict(before.get(part) or {}), dict(manifest.get(part) or {})
        found += [f"{label} {name!r} was removed" for name in sorted(old.keys() - new.keys())]
        found += [f"{label} {name!r} was added" for name in sorted(new.keys() - old.keys())]
        found += [
            f"{label} {name!r} changed" for name in sorted(old.keys() & new.keys()) if old[name] != new[name]
        ]
    old_models, new_models = set(before.get("models") or ()), set(manifest.get("models") or ())
    found += [f"model {m!r} is no longer used" for m in sorted(old_models - new_models)]
    found += [f"model {m!r} is now used" for m in sorted(new_models - old_models)]
    if len(found) == (recorded_version != version):  # the digests differ, the parts do not say
        found.append("the fingerprint changed")
    return found


def _named_tools(tools: JSON) -> list[tuple[str, JSON]]:
    if tools is None:
        return []
    if isinstance(tools, Mapping):
        return [(_text(name, "a tool name"), schema) for name, schema in tools.items()]
    if not isinstance(tools, list | tuple):
        raise UsageError("tools= takes a list of tool schemas or a mapping name → schema")
    named = []
    for schema in tools:
        name = None
        if isinstance(schema, Mapping):
            function = schema.get("function")
            name = schema.get("name") or (function.get("name") if isinstance(function, Mapping) else None)
        if not isinstance(name, str) or not name:
            raise UsageError(
                "each tool schema in tools= needs a name ('name', or"
                " 'function': {'name': …}); or pass a mapping name → schema"
            )
        named.append((name, schema))
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise UsageError(f"tools= names a tool twice: {sorted(names)}")
    return named


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise UsageError(f"{what} must be a non-empty string, not {value!r}")
    return value


def stale_tail(
    steps: Mapping[str, StepRecord], sid: str, through: int, fanouts: Iterable[Iterable[str]]
) -> tuple[list[str], tuple[str, ...]]:
    """A re-plan from the step at ``sid``: (the steps it abandons — it, and every observation
    and decision recorded after it up to seq ``through``, the last one loaded at the claim —
    and those of them it keeps, a sibling fan-out branch's). Only what was recorded before this
    worker took over can be stale: a step it recorded since already answers the new question.
    Inside a fan-out, a sibling branch's steps never asked about this one. Effect and
    transaction steps stay (``KindPolicy.kept_on_replan``), so nothing done is done twice."""
    start = steps[sid].seq
    siblings = tuple(
        prefix
        for branches in fanouts
        if any(sid.startswith(branch) for branch in branches)
        for prefix in branches
        if not sid.startswith(prefix)
    )
    tail = [
        key
        for key, step in list(steps.items())
        if start <= step.seq <= through and (not KINDS[step.kind].kept_on_replan or key == sid)
    ]
    return tail, tuple(key for key in tail if key.startswith(siblings))
