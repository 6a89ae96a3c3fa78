"""Tests for the local effect-owner service: a real subprocess over real HTTP."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from safepoint.testing import (
    OwnerClient,
    OwnerConnectionLost,
    OwnerRejected,
    OwnerService,
    OwnerUnavailable,
)


@pytest.fixture(scope="module")
def service() -> Iterator[OwnerService]:
    with OwnerService() as svc:
        yield svc


@pytest.fixture
def client(service: OwnerService) -> OwnerClient:
    # One process for the module keeps the file fast; reset isolates tests.
    service.client.reset()
    return service.client


def raw_post(
    url: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    host_port = url.removeprefix("http://")
    conn = http.client.HTTPConnection(host_port, timeout=5)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        conn.close()


def wait_until(predicate: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_listening_url_and_health(service: OwnerService, client: OwnerClient) -> None:
    assert service.url.startswith("http://127.0.0.1:")
    assert int(service.url.rsplit(":", 1)[1]) > 0
    assert client.health() is True


def test_idempotent_replay_returns_same_object(client: OwnerClient) -> None:
    first = client.create("charges", {"amount": 500, "currency": "eur"}, idempotency_key="k-1")
    again = client.create("charges", {"amount": 500, "currency": "eur"}, idempotency_key="k-1")
    assert first == again
    assert first["id"].startswith("ch_")
    assert first["object"] == "charges"
    assert first["idempotency_key"] == "k-1"
    assert first["amount"] == 500
    assert isinstance(first["created"], int)
    stats = client.stats()
    assert stats["applied"] == 1
    assert stats["by_resource"]["charges"] == 1
    assert stats["duplicates"] == 0


def test_status_codes_and_replay_header(service: OwnerService, client: OwnerClient) -> None:
    body = json.dumps({"subject": "printer on fire"}).encode()
    status, headers, created = raw_post(service.url, "/tickets", body, {"Idempotency-Key": "t-1"})
    assert status == 201
    assert "Idempotent-Replayed" not in headers
    status, headers, replayed = raw_post(service.url, "/tickets", body, {"Idempotency-Key": "t-1"})
    assert status == 200
    assert headers["Idempotent-Replayed"] == "true"
    assert replayed == created
    assert client.stats()["applied"] == 1


def test_no_key_always_creates_and_counts_duplicates(client: OwnerClient) -> None:
    a = client.create("refunds", {"charge": "ch_1", "amount": 5})
    b = client.create("refunds", {"charge": "ch_1", "amount": 5})
    c = client.create("refunds", {"charge": "ch_1", "amount": 6})
    assert len({a["id"], b["id"], c["id"]}) == 3
    assert a["id"].startswith("re_")
    stats = client.stats()
    assert stats["applied"] == 3
    assert stats["duplicates"] == 1


def test_key_reuse_with_other_params_is_rejected(client: OwnerClient) -> None:
    client.create("charges", {"amount": 500}, idempotency_key="k-2")
    with pytest.raises(OwnerRejected) as info:
        client.create("charges", {"amount": 501}, idempotency_key="k-2")
    assert info.value.status == 409
    assert info.value.error_type == "idempotency_error"
    assert "same parameters" in info.value.body["error"]["message"]
    assert client.stats()["applied"] == 1


def test_keys_are_pruned_after_retention() -> None:
    with OwnerService(key_retention=0.3) as svc:
        first = svc.client.create("charges", {"amount": 700}, idempotency_key="old-key")
        time.sleep(0.45)
        second = svc.client.create("charges", {"amount": 700}, idempotency_key="old-key")
        # Stripe's documented behaviour: a pruned key no longer protects.
        assert second["id"] != first["id"]
        stats = svc.client.stats()
        assert stats["applied"] == 2
        assert stats["duplicates"] == 1


def test_drop_after_commit_loses_response_but_applies(client: OwnerClient) -> None:
    assert client.set_faults(drop_after_commit=1)["drop_after_commit"] == 1
    with pytest.raises(OwnerConnectionLost) as info:
        client.create("charges", {"amount": 900}, idempotency_key="lost-1")
    assert info.value.__cause__ is not None
    assert client.stats()["applied"] == 1
    found = client.find_by_key("charges", "lost-1")
    assert found is not None
    assert found["amount"] == 900
    # The fault is used up: a retry with the same key replays the object.
    assert client.create("charges", {"amount": 900}, idempotency_key="lost-1") == found
    assert client.stats()["applied"] == 1


def test_timeout_is_an_unknown_outcome(service: OwnerService, client: OwnerClient) -> None:
    client.set_faults(delay=0.4)
    impatient = OwnerClient(service.url, timeout=0.1)
    with pytest.raises(OwnerConnectionLost):
        impatient.create("tickets", {"subject": "slow"}, idempotency_key="slow-1")
    wait_until(lambda: client.stats()["applied"] == 1)


def test_fail_before_commit_is_unavailable_and_not_applied(client: OwnerClient) -> None:
    client.set_faults(fail_before_commit=1)
    with pytest.raises(OwnerUnavailable) as info:
        client.create("charges", {"amount": 1}, idempotency_key="f-1")
    assert info.value.status == 503
    assert client.stats()["applied"] == 0
    assert client.create("charges", {"amount": 1}, idempotency_key="f-1")["id"] == "ch_1"


def test_a_decline_is_answered_again_under_its_key_and_applies_nothing(client: OwnerClient) -> None:
    client.set_faults(decline=1)
    for _ in range(2):  # the refusal is kept under its key, as Stripe keeps a declined request's
        with pytest.raises(OwnerRejected) as declined:
            client.create("charges", {"amount": 7}, idempotency_key="d-1")
        assert (declined.value.status, declined.value.error_type) == (402, "card_error")
    assert client.stats()["applied"] == 0
    # under another key the same request is a new one, and the owner takes it
    assert client.create("charges", {"amount": 7}, idempotency_key="d-2")["idempotency_key"] == "d-2"
    assert client.stats()["applied"] == 1


def test_index_lag_fault_hides_from_search_not_from_get(client: OwnerClient) -> None:
    client.set_faults(index_lag=0.4)
    obj = client.create("tickets", {"subject": "lagging"}, idempotency_key="lag-1")
    assert client.find_by_key("tickets", "lag-1") is None
    assert client.get("tickets", obj["id"]) == obj
    wait_until(lambda: client.find_by_key("tickets", "lag-1") == obj)


def test_index_lag_from_command_line() -> None:
    with OwnerService(index_lag=0.3) as svc:
        obj = svc.client.create("charges", {"amount": 3}, idempotency_key="cli-lag")
        assert svc.client.find_by_key("charges", "cli-lag") is None
        assert svc.client.get("charges", obj["id"]) == obj
        time.sleep(0.35)
        assert svc.client.find_by_key("charges", "cli-lag") == obj


def test_get_unknown_id_is_none(client: OwnerClient) -> None:
    assert client.get("charges", "ch_404") is None
    assert client.find_by_key("charges", "never-used") is None


def test_notifications_have_no_read_path(client: OwnerClient) -> None:
    a = client.create("notifications", {"to": "ops"}, idempotency_key="n-1")
    b = client.create("notifications", {"to": "ops"}, idempotency_key="n-1")
    assert a["id"] != b["id"]  # keys are ignored: every POST sends another one
    stats = client.stats()
    assert stats["by_resource"]["notifications"] == 2
    assert stats["duplicates"] == 1
    with pytest.raises(OwnerRejected) as info:
        client.find_by_key("notifications", "n-1")
    assert info.value.status == 404
    assert info.value.error_type == "no_read_path"
    with pytest.raises(OwnerRejected) as info:
        client.get("notifications", a["id"])
    assert info.value.error_type == "no_read_path"


def test_stale_fence_is_refused(client: OwnerClient) -> None:
    client.create("charges", {"amount": 1}, fence=5, fence_resource="lease-a")
    with pytest.raises(OwnerRejected) as info:
        client.create("charges", {"amount": 2}, fence=3, fence_resource="lease-a")
    assert info.value.status == 409
    assert info.value.error_type == "stale_fence"
    assert client.stats()["applied"] == 1
    client.create("charges", {"amount": 3}, fence=5, fence_resource="lease-a")  # equal is fine
    client.create("charges", {"amount": 4}, fence=1, fence_resource="lease-b")  # other lease
    client.create("charges", {"amount": 5}, fence=7, fence_resource="lease-a")
    stats = client.stats()
    assert stats["applied"] == 4
    assert stats["highest_fence"] == {"lease-a": 7, "lease-b": 1}


def test_bad_bodies_are_rejected(service: OwnerService, client: OwnerClient) -> None:
    for body in (b"[1, 2]", b"not json", b""):
        status, _, reply = raw_post(service.url, "/charges", body)
        assert status == 400, body
        assert reply["error"]["type"] == "invalid_request_error"
    with pytest.raises(OwnerRejected) as info:
        client.create("charges", {"id": "ch_forged"})
    assert info.value.status == 400
    with pytest.raises(OwnerRejected):
        client.set_faults(no_such_fault=1)
    assert client.stats()["applied"] == 0


@pytest.mark.parametrize("path", ["/charges", "/_faults"])
def test_a_body_nested_too_deeply_to_read_is_a_400_not_a_dropped_connection(
    service: OwnerService, client: OwnerClient, path: str
) -> None:
    """Python's decoder raises RecursionError, not ValueError, past its depth; at the edge, the
    body decodes and its digest (the body written again) may not. Whatever the depth, an answer
    comes (the answer to a body the owner took is not read here: it is as deep)."""
    for depth in (100_000, *range(960, 1001, 4)):
        body = f'{{"amount": {"[" * depth + "]" * depth}}}'.encode()
        conn = http.client.HTTPConnection(service.url.removeprefix("http://"), timeout=5)
        try:
            headers = {"Content-Type": "application/json", "Idempotency-Key": f"deep-{depth}"}
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            status, text = response.status, response.read()
        finally:
            conn.close()
        assert status in (201, 400), (depth, text[:200])
        if status == 400:
            assert json.loads(text)["error"]["type"] == "invalid_request_error"
    assert status == 400  # 1000 levels: never read
    assert client.health()


def test_connection_refused_is_unavailable() -> None:
    with OwnerService() as svc:
        url = svc.url
    assert svc.returncode == 0  # SIGTERM is a clean stop, not a kill
    dead = OwnerClient(url, timeout=2)
    with pytest.raises(OwnerUnavailable) as info:
        dead.create("charges", {"amount": 1}, idempotency_key="x")
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
    assert dead.health() is False


def test_reset_clears_everything(client: OwnerClient) -> None:
    old = client.create("charges", {"amount": 1}, idempotency_key="r-1", fence=9, fence_resource="l")
    client.create("charges", {"amount": 1})
    client.set_faults(delay=0.01, index_lag=5, fail_before_commit=2, drop_after_commit=3)
    client.reset()
    assert client.faults() == {
        "drop_after_commit": 0,
        "fail_before_commit": 0,
        "decline": 0,
        "delay": 0.0,
        "index_lag": 0.0,
    }
    stats = client.stats()
    assert stats["applied"] == 0
    assert stats["duplicates"] == 0
    assert stats["highest_fence"] == {}
    assert all(n == 0 for n in stats["by_resource"].values())
    assert client.get("charges", old["id"]) is None
    # The key is forgotten: other params no longer conflict; counters restart.
    fresh = client.create("charges", {"amount": 2}, idempotency_key="r-1", fence=1, fence_resource="l")
    assert fresh["id"] == "ch_1"


# -- a connection kept alive, as an application's pooled client keeps one ---------------------


def test_a_kept_alive_client_sends_every_request_on_one_connection(
    service: OwnerService, client: OwnerClient
) -> None:
    pooled = OwnerClient(service.url, keep_alive=True)
    first = pooled.create("tickets", {"n": 1}, idempotency_key="ka-1")
    local = pooled._kept.conn.sock.getsockname()
    assert pooled.create("tickets", {"n": 2}, idempotency_key="ka-2")["id"] != first["id"]
    assert pooled.get("tickets", first["id"]) == first
    assert pooled._kept.conn.sock.getsockname() == local
    assert client.stats()["applied"] == 2


def test_a_kept_connection_that_breaks_is_an_unknown_outcome_then_a_fresh_one_is_opened(
    service: OwnerService, client: OwnerClient
) -> None:
    pooled = OwnerClient(service.url, keep_alive=True)
    pooled.create("charges", {"amount": 1}, idempotency_key="kb-1")
    client.set_faults(drop_after_commit=1)
    with pytest.raises(OwnerConnectionLost):
        pooled.create("charges", {"amount": 2}, idempotency_key="kb-2")
    assert client.stats()["applied"] == 2  # it was applied: only reconciliation can tell
    assert pooled.create("charges", {"amount": 3}, idempotency_key="kb-3")["amount"] == 3


def test_a_kept_connection_to_an_owner_that_went_away_is_never_called_unavailable() -> None:
    """The owner may have read a request sent on a connection opened before: only a connection
    refused at opening proves nothing was sent."""
    with OwnerService() as svc:
        pooled = OwnerClient(svc.url, keep_alive=True, timeout=2)
        pooled.create("tickets", {"n": 1}, idempotency_key="gone-1")
    with pytest.raises(OwnerConnectionLost):
        pooled.create("tickets", {"n": 2}, idempotency_key="gone-2")
    with pytest.raises(OwnerUnavailable):
        pooled.create("tickets", {"n": 2}, idempotency_key="gone-2")
