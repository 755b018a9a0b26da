"""The depth count and the JSON-object parse that stand before every body the servers
read."""

import json
import time

import pytest

from serving.security.body import BodyError, json_depth, parse_object


@pytest.mark.parametrize(
    ("raw", "depth"),
    [
        (b"1", 0),
        (b"", 0),
        (b"[]", 1),
        (b'{"a": [{"b": [1]}]}', 4),
        (b"[[], [[]], [], []]", 3),  # the deepest point, not the count of brackets
        (b'{"a": "[[[[{{{{"}', 1),  # brackets inside a string are text
        (b'{"a": "\\"[[[", "b": [[]]}', 3),  # an escaped quote does not end the string
        (b'["\\\\", [[]]]', 3),  # an escaped backslash does not escape the closing quote
    ],
)
def test_json_depth_counts_nesting_outside_strings(raw, depth):
    assert json_depth(raw) == depth
    if raw:
        assert json_depth(raw) == _reference_depth(json.loads(raw))


def _reference_depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_reference_depth(v) for v in value), default=0)
    return 0


def test_a_hostile_nested_body_is_refused_quickly_naming_the_limit():
    raw = b"[" * 900_000  # the body: json.loads raised RecursionError on it
    started = time.perf_counter()
    with pytest.raises(BodyError, match=r"at most 64 \(limits\.max_json_depth\)"):
        parse_object(raw, max_depth=64)
    assert time.perf_counter() - started < 1.0
    closed = b"[" * 5000 + b"]" * 5000  # valid JSON, still too deep
    with pytest.raises(BodyError, match="at least"):
        parse_object(closed, max_depth=64)


def test_a_body_at_the_limit_passes_and_one_past_it_does_not():
    at_limit = b'{"a": ' + b"[" * 63 + b"]" * 63 + b"}"
    assert parse_object(at_limit, max_depth=64)["a"] is not None
    with pytest.raises(BodyError):
        parse_object(b'{"a": ' + b"[" * 64 + b"]" * 64 + b"}", max_depth=64)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (b'"text"', "must be a JSON object, got str"),
    ],
)
def test_other_bad_bodies_are_body_errors(raw, needle):
    with pytest.raises(BodyError, match=needle):
        parse_object(raw, max_depth=64)
