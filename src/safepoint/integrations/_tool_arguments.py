"""The arguments of a tool: its JSON schema, generated from the function's signature (pydantic) or
written by hand, and the check of what a model sent against it — before any step, so that
what the model asked for wrongly becomes an error outcome instead of a recorded failure.

Private to ``safepoint.integrations.tools``.
"""

from __future__ import annotations

import copy
import inspect
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import safepoint as sp
from safepoint.errors import UsageError

_PYDANTIC_HINT = "pip install 'safepoint[anthropic]' (or 'safepoint[openai]'), which bring pydantic"


class Invalid(Exception):
    """The arguments a model sent do not fit the tool: the message says what was wrong."""


def pydantic_module() -> Any:
    try:
        import pydantic
    except ImportError as exc:
        raise UsageError(
            "generating a tool's schema from its signature needs pydantic, which is not"
            f" installed: {_PYDANTIC_HINT} — or give the schema yourself (tools.add(...,"
            " schema={...}))"
        ) from exc
    return pydantic


def jsonable(value: Any) -> Any:
    """What a tool returned, as JSON where pydantic can say how (a model, a dataclass, a
    date); anything else as it is, for the step to refuse with the path that is not JSON."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        from pydantic_core import to_jsonable_python
    except ImportError:
        return value
    try:
        return to_jsonable_python(value)
    except Exception:  # not convertible: the step says where it is not JSON
        return value


def without_titles(schema: Any) -> Any:
    """A JSON schema without the ``title`` keywords pydantic adds (the model never needs them,
    and they would move a definition whenever a Python name changes). Names under
    ``properties`` and ``$defs`` are kept, and so is what ``default``, ``examples``, ``const``
    and ``enum`` hold: they are values, not schemas."""
    if isinstance(schema, list):
        return [without_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("default", "examples", "const", "enum"):
            kept[key] = value
        elif key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            kept[key] = {name: without_titles(sub) for name, sub in value.items()}
        else:
            kept[key] = without_titles(value)
    return kept


@dataclass(frozen=True, slots=True)
class Signature:
    """A function's parameters as a pydantic model: its schema, and its validation of the
    arguments a model sends. Each field is named by position and aliased to the parameter, so
    that no parameter name can collide with pydantic's own."""

    model: Any  # a pydantic model class, made at declaration
    parameters: tuple[str, ...]
    json_schema: dict[str, Any]  # generated once: the definitions are sent every turn

    @classmethod
    def of(
        cls, tool: str, fn: Callable[..., Any], parameters: list[inspect.Parameter], hints: dict[str, Any]
    ) -> Signature:
        pydantic = pydantic_module()
        fields: dict[str, Any] = {}
        for index, parameter in enumerate(parameters):
            annotation = hints.get(parameter.name, Any)
            default = ... if parameter.default is inspect.Parameter.empty else parameter.default
            fields[f"p{index}"] = (
                typing.Annotated[annotation, pydantic.Field(alias=parameter.name)],
                default,
            )
        try:
            model = pydantic.create_model(
                f"{tool}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
            )
            json_schema = without_titles(model.model_json_schema())  # what pydantic cannot describe, said now
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as exc:
            raise UsageError(
                f"tool {tool!r}: no JSON schema for the parameters of {fn.__qualname__}: {exc}"
            ) from exc
        return cls(model, tuple(p.name for p in parameters), json_schema)

    def schema(self) -> dict[str, Any]:
        return copy.deepcopy(self.json_schema)  # the caller's own: a change stays there

    def validate(self, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the arguments as JSON, as recorded; the keyword arguments to call the function with)."""
        pydantic = pydantic_module()
        try:
            validated = self.model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            raise Invalid(
                "; ".join(
                    f"{'.'.join(str(part) for part in error['loc']) or '(arguments)'}: {error['msg']}"
                    for error in exc.errors(include_url=False, include_input=False)
                )
            ) from None
        as_json = validated.model_dump(mode="json", by_alias=True)
        kwargs = {name: getattr(validated, f"p{index}") for index, name in enumerate(self.parameters)}
        return as_json, kwargs


@dataclass(frozen=True, slots=True)
class Written:
    """A schema written by hand: the arguments are checked only for what it states plainly
    (an object, its required properties, no others where it says so) and passed as sent."""

    written: dict[str, Any]

    def schema(self) -> dict[str, Any]:
        return copy.deepcopy(self.written)

    def validate(self, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        problems = [
            f"{name}: Field required" for name in self.written.get("required", ()) if name not in arguments
        ]
        if self.written.get("additionalProperties") is False:
            known = self.written.get("properties", {})
            problems += [f"{name}: Extra inputs are not permitted" for name in arguments if name not in known]
        if problems:
            raise Invalid("; ".join(problems))
        return dict(arguments), dict(arguments)


def checked_schema(tool: str, schema: Any) -> dict[str, Any]:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise UsageError(f'tool {tool!r}: schema= is a JSON schema of an object ({{"type": "object", ...}})')
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"tool {tool!r}: schema= must be JSON: {exc}") from exc
    return copy.deepcopy(schema)


def is_key(annotation: Any) -> bool:
    return annotation is sp.EffectKey or (
        typing.get_origin(annotation) is typing.Annotated and typing.get_args(annotation)[0] is sp.EffectKey
    )


_NOT_BY_NAME = frozenset(
    {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY}
)


def parameters_of(
    tool: str, fn: Callable[..., Any], *, written: bool
) -> tuple[list[inspect.Parameter], str | None, dict[str, Any]]:
    """(the parameters a model fills, the one that receives the effect key, the types). Under
    a schema ``written`` by hand, ``**kwargs`` may take what it states; a generated schema
    needs every parameter named."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a name the annotations use that the function's module lacks
        raise UsageError(
            f"tool {tool!r}: the annotations of {getattr(fn, '__qualname__', fn)!r} cannot be"
            f" resolved ({type(exc).__name__}: {exc}); define the types they name at module level"
        ) from exc
    parameters: list[inspect.Parameter] = []
    key: str | None = None
    refused = _NOT_BY_NAME - {inspect.Parameter.VAR_KEYWORD} if written else _NOT_BY_NAME
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in refused:
            raise UsageError(
                f"tool {tool!r}: parameter {parameter.name!r} of {fn.__qualname__} is"
                f" {parameter.kind.description}; a tool is called with its arguments by name, so"
                " each parameter is a plain named one"
            )
        if is_key(hints.get(parameter.name)):
            if key is not None:
                raise UsageError(
                    f"tool {tool!r}: two parameters ({key!r}, {parameter.name!r}) take the EffectKey"
                )
            key = parameter.name
        else:
            parameters.append(parameter)
    return parameters, key, hints


def is_async(fn: Any) -> bool:
    """An ``async def`` function, or an object with an async ``__call__``."""
    call = type(fn).__call__ if callable(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def description_of(fn: Callable[..., Any] | None, given: str) -> str:
    """``given``, else the first paragraph of the function's docstring, on one line."""
    if given or fn is None:
        return given
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def parsed(arguments: Mapping[str, Any] | str) -> Mapping[str, Any]:
    """The arguments as a mapping: OpenAI sends JSON text (empty for a tool without any)."""
    if isinstance(arguments, Mapping):
        return arguments
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise Invalid(f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})") from None
    except RecursionError:  # what Python's decoder raises past its depth: no JSONDecodeError
        raise Invalid("the arguments are not valid JSON (nested too deeply to be read)") from None
    if not isinstance(parsed, dict):
        raise Invalid(f"the arguments are a JSON object, not {type(parsed).__name__}")
    return parsed
