"""The dashboard's routes and its JSON API: what each address answers, how a listing's query
string becomes a ``RunQuery``, and the JSON of runs, a run's ledger and the workers.

``ROUTES`` is the one list of what the server answers: the handler routes by it
(``match_route``) and the OpenAPI document (``dashboard_openapi``) is drawn from it, so neither
can name an address the other does not. A query the listing cannot read — an unknown status, a
time that is not one, a cursor that was not given out — is a ``Refusal`` saying what to send.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import UTC, datetime
from enum import Enum
from http import HTTPStatus
from typing import Any

from .._rules.canonical import decode_json
from .._rules.presence import LEASE_EXPIRED, ownership
from .._rules.records import record_fields
from ..storage.base import Store
from ..types import EventRecord, Ledger, RunPage, RunQuery, RunRecord, RunStatus, UnreadableRun
from .admission import Refusal
from .dashboard_actions import ACTIONS
from .dashboard_timeline import chain_of, forks_made, timeline

__all__ = [
    "LIST_FILTERS",
    "MAX_PAGE",
    "ROUTES",
    "Route",
    "match_route",
    "page_json",
    "plain",
    "run_detail_json",
    "run_json",
    "run_query",
    "workers",
]

MAX_PAGE = 500  # runs on one page, at most: a bigger listing is paged, never cut silently
DEFAULT_PAGE = 50


@dataclass(frozen=True)
class Route:
    """One address the dashboard answers: its method, its path (``{run_id}``: one segment),
    what it is (``summary``), whether it needs the token, what it answers (``answers``:
    ``html``, ``json``, ``script``, ``style`` or ``redirect``) and the query it reads."""

    method: str
    path: str
    name: str
    summary: str
    token: bool
    answers: str
    query: tuple[str, ...] = ()
    form: frozenset[str] = field(default_factory=frozenset)

    @property
    def segments(self) -> list[str]:
        return self.path.split("/")[1:]


# The filters of a listing (``/`` and ``/api/runs``): name → what it does.
LIST_FILTERS: dict[str, str] = {
    "status": "only runs of this status (" + ", ".join(s.value for s in RunStatus) + ")",
    "workflow": "only runs of this workflow",
    "version": "only runs of this workflow version",
    "q": "only runs whose id holds this text (ASCII case ignored)",
    "created_after": "only runs created at or after this instant (ISO 8601, UTC unless it says; or epoch ms)",
    "created_before": "only runs created before this instant",
    "updated_after": "only runs changed at or after this instant",
    "updated_before": "only runs changed before this instant",
    "limit": f"runs per page (1 to {MAX_PAGE}; default {DEFAULT_PAGE})",
    "cursor": "the `next_cursor` of the page before: the page after it",
}

_LISTING = tuple(LIST_FILTERS)

ROUTES: tuple[Route, ...] = (
    Route("GET", "/", "runs_page", "The runs: counts per status, filters, pages", False, "html", _LISTING),
    Route("GET", "/inbox", "inbox_page", "What needs a person to decide", False, "html"),
    Route("GET", "/workers", "workers_page", "Who holds which run, lease and last heartbeat", False, "html"),
    Route("GET", "/runs/{run_id}", "run_page", "One run: decisions, timeline, values, events", False, "html"),
    Route("GET", "/static/console.css", "style", "The console's style sheet", False, "style"),
    Route("GET", "/static/console.js", "script", "The console's script", False, "script"),
    Route("GET", "/api/openapi.json", "openapi", "This document", False, "json"),
    Route("GET", "/api/runs", "api_runs", "The runs, filtered, counted and paged", True, "json", _LISTING),
    Route("GET", "/api/runs/{run_id}", "api_run", "One run: timeline, effects, events", True, "json"),
    Route("GET", "/api/workers", "api_workers", "Runs by worker; expired leases flagged", True, "json"),
    *(
        Route("POST", f"/runs/{{run_id}}/{name}", f"action_{name}", f"{name}", True, "redirect", form=spec)
        for name, (_, spec) in ACTIONS.items()
    ),
)  # fmt: skip


def match_route(method: str, segments: list[str]) -> tuple[Route, dict[str, str]] | None:
    """The route answering ``method`` at these path segments, and its path parameters; None when
    no route does (a HEAD is answered as its GET)."""
    method = "GET" if method == "HEAD" else method
    for route in ROUTES:
        pattern = route.segments
        if route.method != method or len(pattern) != len(segments):
            continue
        params: dict[str, str] = {}
        for part, given in zip(pattern, segments, strict=True):
            if part.startswith("{") and part.endswith("}"):
                if not given:
                    break
                params[part[1:-1]] = given
            elif part != given:
                break
        else:
            return route, params
    return None


def run_json(run: RunRecord | UnreadableRun, now: int) -> dict[str, Any]:
    """A run as JSON, with how its ownership reads now (an unreadable one: what could be read,
    and why the rest cannot)."""
    if isinstance(run, UnreadableRun):
        return {**plain(run), "unreadable": True}
    return {**plain(run), "ownership": asdict(ownership(run, now))}


def plain(record: Any) -> Any:
    """A record as JSON-ready data (enums by value)."""
    if is_dataclass(record) and not isinstance(record, type):
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in record_fields(record).items()}
    return record


# -- a listing's query ---------------------------------------------------------------------------


def _instant(name: str, text: str) -> int:
    """An instant from a query: epoch ms, or ISO 8601 (``2030-01-31``, ``2030-01-31T17:00``
    as a browser's date-time field sends it, with an offset or ``Z``; UTC when it has none)."""
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise Refusal(
            HTTPStatus.BAD_REQUEST,
            f"{name}={text[:40]!r} is not an instant: send ISO 8601 (2030-01-31T17:00:00Z) or epoch ms",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def encode_cursor(after: tuple[int, str]) -> str:
    """A page's keyset as the opaque ``cursor`` the next request sends back."""
    return base64.urlsafe_b64encode(json.dumps(list(after)).encode()).decode().rstrip("=")


def _decode_cursor(text: str) -> tuple[int, str]:
    try:
        created, run_id = decode_json(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if isinstance(created, int) and isinstance(run_id, str):
            return created, run_id
    except (ValueError, TypeError, binascii.Error):
        pass
    raise Refusal(
        HTTPStatus.BAD_REQUEST,
        "the cursor is not one this dashboard gave out: send a page's `next_cursor` as it came, or none",
    )


def run_query(params: dict[str, str]) -> RunQuery:
    """The ``RunQuery`` a listing's query string asks for (an empty value: not asked)."""
    given = {name: value.strip() for name, value in params.items() if value.strip()}
    unknown = sorted(set(given) - set(LIST_FILTERS) - {"done"})
    if unknown:
        raise Refusal(
            HTTPStatus.BAD_REQUEST,
            f"the listing has no filter {unknown[0][:40]!r}: it takes {', '.join(LIST_FILTERS)}",
        )
    status = given.get("status")
    if status is not None and status not in {s.value for s in RunStatus}:
        raise Refusal(
            HTTPStatus.BAD_REQUEST,
            f"no status {status[:40]!r}: one of {', '.join(s.value for s in RunStatus)}",
        )
    limit_text = given.get("limit", str(DEFAULT_PAGE))
    if not (limit_text.isascii() and limit_text.isdigit() and 1 <= int(limit_text) <= MAX_PAGE):
        raise Refusal(
            HTTPStatus.BAD_REQUEST, f"limit={limit_text[:20]!r}: send a whole number from 1 to {MAX_PAGE}"
        )

    def moment(name: str) -> int | None:
        return _instant(name, given[name]) if name in given else None

    return RunQuery(
        status=RunStatus(status) if status else None,
        workflow=given.get("workflow"),
        workflow_version=given.get("version"),
        search=given.get("q"),
        created_from=moment("created_after"),
        created_to=moment("created_before"),
        updated_from=moment("updated_after"),
        updated_to=moment("updated_before"),
        limit=int(limit_text),
        after=_decode_cursor(given["cursor"]) if "cursor" in given else None,
    )


def page_json(page: RunPage, now: int) -> dict[str, Any]:
    """A listing's page as JSON: its runs, the total, the counts per status, the next cursor."""
    return {
        "runs": [run_json(run, now) for run in page.runs],
        "total": page.total,
        "counts": {status.value: count for status, count in page.counts.items()},
        "next_cursor": encode_cursor(page.next_after) if page.next_after else None,
    }


def run_detail_json(store: Store, ledger: Ledger, events: list[EventRecord], now: int) -> dict[str, Any]:
    """One run as JSON: the run, its timeline, steps, operations, messages, events, chain, forks."""
    run = ledger.run
    return {
        "run": run_json(run, now),
        "timeline": [entry.json() for entry in timeline(ledger, events)],
        "steps": [plain(step) for step in sorted(ledger.steps.values(), key=lambda step: step.seq)],
        "operations": [plain(op) for op in ledger.operations.values()],
        "messages": [plain(m) for m in store.messages(run.run_id)],
        "events": [plain(event) for event in events],
        "chain": [link.run_id for link in chain_of(store, run)],
        "forks": forks_made(events),
    }


# -- workers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """A run a worker holds, as the workers page shows it."""

    run: RunRecord
    expired: bool  # its lease ended: the worker is gone or stalled


def workers(
    store: Store, now: int, limit: int = MAX_PAGE
) -> tuple[dict[str, list[Held]], list[UnreadableRun], int]:
    """The running runs by the worker that holds them (``""``: released, held by nobody), those
    whose row cannot be read here (a value sealed with a key the keyring lacks: shown apart,
    never left out), and how many running runs there are in all (the page shows at most
    ``limit``)."""
    page = store.query_runs(RunQuery(status=RunStatus.RUNNING, limit=limit))
    held: dict[str, list[Held]] = {}
    unreadable: list[UnreadableRun] = []
    for run in page.runs:
        if isinstance(run, UnreadableRun):
            unreadable.append(run)
            continue
        state = ownership(run, now).state
        held.setdefault(run.owner or "", []).append(Held(run, state == LEASE_EXPIRED))
    return held, unreadable, page.total


def workers_json(store: Store, now: int) -> dict[str, Any]:
    held, unreadable, total = workers(store, now)
    return {
        "workers": [
            {
                "worker": worker or None,
                "runs": [
                    {
                        "run_id": h.run.run_id,
                        "workflow": h.run.workflow,
                        "lease_expires_at": h.run.lease_expires_at,
                        "heartbeat_at": h.run.heartbeat_at,
                        "lease_expired": h.expired,
                    }
                    for h in runs
                ],
            }
            for worker, runs in sorted(held.items())
        ],
        "unreadable": [
            {"run_id": run.run_id, "worker": run.owner, "reason": run.reason} for run in unreadable
        ],
        "running": total,
    }
