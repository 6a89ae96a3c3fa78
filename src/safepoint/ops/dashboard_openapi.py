"""The OpenAPI 3.1 document of the dashboard, drawn from its routes (``dashboard_api.ROUTES``):
every address it answers, with its parameters, what it needs (the token, as a Bearer header or
a form field) and what it answers, errors included. Served at ``/api/openapi.json``."""

from __future__ import annotations

from typing import Any

from .dashboard_api import LIST_FILTERS, ROUTES, Route

__all__ = ["openapi_document"]

_CONTENT = {
    "html": "text/html",
    "json": "application/json",
    "script": "text/javascript",
    "style": "text/css",
}

_ERROR = {
    "type": "object",
    "required": ["error", "status"],
    "properties": {
        "error": {"type": "string", "description": "what went wrong, and what to send instead"},
        "status": {"type": "integer", "description": "the HTTP status, repeated"},
    },
}


def _errors(route: Route) -> dict[str, Any]:
    answer = {
        "description": "refused: the error says why (JSON for API clients and /api/ paths)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    codes = ["400", "404", "421"]
    if route.token:
        codes += ["401", "403"]
    if route.method == "POST":
        codes += ["403", "409", "413"]
    found = {code: answer for code in sorted(set(codes))}
    if route.name == "api_run":  # a ledger this store cannot read (a key its keyring lacks)
        found["409"] = {
            "description": "the run's ledger cannot be read here: the error says why, `key_id` names"
            " the key missing from the keyring (when that is why) and `run` is the run as its row reads",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    return dict(sorted(found.items()))


def _parameters(route: Route) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = [
        {"name": part[1:-1], "in": "path", "required": True, "schema": {"type": "string"}}
        for part in route.segments
        if part.startswith("{")
    ]
    found += [
        {
            "name": name,
            "in": "query",
            "required": False,
            "description": LIST_FILTERS[name],
            "schema": {"type": "string"},
        }
        for name in route.query
    ]
    return found


def _operation(route: Route) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": route.name, "summary": route.summary}
    if route.token:
        operation["security"] = [{"token": []}]
    parameters = _parameters(route)
    if parameters:
        operation["parameters"] = parameters
    if route.method == "POST":
        fields = {name: {"type": "string"} for name in sorted(route.form | {"token", "back"})}
        schema = {"type": "object", "properties": fields, "additionalProperties": False}
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/x-www-form-urlencoded": {"schema": schema},
                "application/json": {"schema": schema},
            },
        }
        operation["responses"] = {
            "200": {
                "description": "done (Accept: application/json): the run acted on, or the fork made",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}},
            },
            "303": {"description": "done: to the page of the run (or the inbox), with a confirmation"},
            **_errors(route),
        }
        return operation
    content = _CONTENT[route.answers]
    body: dict[str, Any] = {"schema": {"type": "string"}}
    if route.answers == "json":
        body = {"schema": {"type": "object"}}
        if route.name == "api_runs":
            body = {"schema": {"$ref": "#/components/schemas/RunPage"}}
    operation["responses"] = {
        "200": {"description": route.summary, "content": {content: body}},
        **_errors(route),
    }
    return operation


def openapi_document() -> dict[str, Any]:
    """The document: OpenAPI 3.1, one path per route."""
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "safepoint dashboard",
            "version": "1",
            "description": (
                "The runs of one safepoint ledger, on loopback only. The JSON API and every"
                " action need the dashboard's token (printed when it starts), as"
                " `Authorization: Bearer …` or, in a form, the `token` field."
            ),
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": _ERROR,
                "Run": {"type": "object", "required": ["run_id", "status"], "additionalProperties": True},
                "RunPage": {
                    "type": "object",
                    "required": ["runs", "total", "counts", "next_cursor"],
                    "properties": {
                        "runs": {"type": "array", "items": {"$ref": "#/components/schemas/Run"}},
                        "total": {
                            "type": "integer",
                            "description": "runs matching the filters, on every page",
                        },
                        "counts": {
                            "type": "object",
                            "additionalProperties": {"type": "integer"},
                            "description": "runs of each status matching the filters but the status",
                        },
                        "next_cursor": {
                            "type": ["string", "null"],
                            "description": "send as `cursor` for the next page",
                        },
                    },
                },
            },
        },
    }
