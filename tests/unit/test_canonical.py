"""Canonical JSON and input hashes: RFC 8785 exactly, any JSON type, any nesting an earlier
version hashed, and non-JSON located before anything is recorded."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from safepoint._rules.canonical import canonical, digest, find_non_json, input_hash
from safepoint.errors import NotJSON

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)

HOUR = timedelta(hours=1)


def test_rfc8785_canonical_form() -> None:
    # key order by UTF-16 code units, no whitespace, shortest float form
    assert canonical({"b": 1, "a": [1.0, 1e21, "é"]}) == b'{"a":[1,1e+21,"\xc3\xa9"],"b":1}'
    assert input_hash({"x": 1}) == input_hash({"x": 1.0})
    assert digest(b"abc").startswith("sha256:ba7816bf")


@given(json_values)
def test_hash_ignores_key_order(value: object) -> None:
    if isinstance(value, dict):
        reordered = dict(reversed(list(value.items())))
        assert input_hash(value) == input_hash(reordered)
    assert find_non_json(value) is None


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ({"a": {1, 2}}, ("$.a", "set")),
        ([1, (2, 3)], ("$[1]", "tuple")),
        ({1: "x"}, ("$ key 1", "int")),
        (float("nan"), ("$", "non-finite float nan")),
        (2**60, ("$", "integer beyond 2**53")),
        (b"bytes", ("$", "bytes")),
    ],
)
def test_non_json_is_located(value: object, found: tuple[str, str]) -> None:
    assert find_non_json(value) == found


def test_tuples_are_fine_as_inputs() -> None:
    assert find_non_json([1, (2, 3)], allow_tuples=True) is None


def test_the_fast_canonical_encoder_writes_exactly_what_rfc_8785_writes() -> None:
    """canonical() takes Python's own encoder for values it writes identically; 3000 random
    values (escapes, controls, non-BMP text, BMP-ordered keys, nesting, edge integers) must
    come out byte for byte as the RFC 8785 library writes them — and floats and keys beyond
    the BMP take the library's path."""
    import random
    import string

    import rfc8785

    from safepoint._rules.canonical import _plain, canonical

    rng = random.Random(8785)
    alphabet = string.printable + "\x00\x01\x1f\x7f\u00e9\u2028\u2029\ufffd\u4e2d\ue000\U0001f600"

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))

    def value(depth: int = 0) -> object:
        roll = rng.random()
        if depth > 3 or roll < 0.35:
            return rng.choice([text(), rng.randint(-(2**53) + 1, 2**53 - 1), True, False, None])
        if roll < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {text().replace("\U0001f600", ""): value(depth + 1) for _ in range(rng.randint(0, 4))}

    for _ in range(3000):
        sample = value()
        assert canonical(sample) == rfc8785.dumps(sample), sample
    assert _plain({"\U0001f600": 1}) is False  # UTF-16 order differs: the library decides
    assert canonical({"\U0001f600": 1, "\ue000": 2}) == rfc8785.dumps({"\U0001f600": 1, "\ue000": 2})
    assert _plain([1.5]) is False
    assert canonical([1.0, 1e-7, 0.1, -0.0]) == rfc8785.dumps([1.0, 1e-7, 0.1, -0.0])


def test_inputs_of_any_json_type_hash_as_their_json_and_a_lone_surrogate_key_is_refused() -> None:
    """The input scan tests exact types first: subclasses (enums, ordered dicts, named tuples)
    must still hash as the JSON they encode to, and a key Python cannot write as UTF-8 must
    be refused as not JSON, naming the key, never escape as a UnicodeEncodeError."""
    import collections
    import enum

    import rfc8785

    from safepoint._rules.canonical import canonical, canonical_if_json, checked_canonical

    class Level(enum.IntEnum):
        HIGH = 3

    class Colour(enum.StrEnum):
        RED = "red"

    pair = collections.namedtuple("pair", "a b")
    assert canonical([Level.HIGH, Colour.RED]) == b'[3,"red"]'
    assert canonical(collections.OrderedDict(b=1, a=[True, None])) == rfc8785.dumps(
        {"a": [True, None], "b": 1}
    )
    assert canonical_if_json(pair(1, "x"), allow_tuples=True) == b'[1,"x"]'
    assert canonical_if_json((1, 2)) is None  # tuples only where inputs allow them
    assert canonical_if_json({"a": 2**53}) is None
    assert canonical_if_json({"\ud800": 1}) is None
    with pytest.raises(NotJSON, match="lone surrogate") as refused:
        checked_canonical({"ok": {"\ud800": 1}}, "inputs", "s1")
    assert "\\ud800" in str(refused.value)


def test_deeply_nested_inputs_hash_as_before() -> None:
    """The input scan takes one frame per level of nesting: inputs nested 600 deep, which every
    earlier version hashed, still hash (two frames per level would refuse them as not JSON)."""
    from safepoint._rules.canonical import canonical_if_json

    nested_list: object = 1
    nested_dict: object = 1
    for _ in range(600):
        nested_list, nested_dict = [nested_list], {"k": nested_dict}
    assert canonical_if_json(nested_list) == b"[" * 600 + b"1" + b"]" * 600
    assert canonical_if_json(nested_dict, allow_tuples=True) is not None
