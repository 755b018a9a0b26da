"""A request body as a JSON object, or a :class:`BodyError` saying why not, before any
recursive parser sees a hostile one.

``json.loads`` recurses once per nesting level; a body of 900 KB of ``[[[[`` made it raise
``RecursionError`` (a 500). :func:`json_depth` measures the nesting first, without
recursion and at C speed: string literals are blanked by one regular expression, every
byte but the brackets is dropped by ``bytes.translate``, and the depth is the running sum
of +1/-1 over what is left (``itertools.accumulate``). A body nested deeper than the
server's limit (``limits.max_json_depth``) is refused before ``json.loads`` runs.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from serving.errors import BadInputError

DEPTH_KEY = "limits.max_json_depth"

# A JSON string literal (escapes included); possessive, so a long one cannot backtrack.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
# After translate: an opening bracket is byte 2, a closing one byte 0; minus one each.
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_CHUNK = 1 << 14


class BodyError(BadInputError):
    """The body is not a JSON object this server takes (HTTP 400)."""


def json_depth(raw: bytes, *, stop_above: int | None = None) -> int:
    """The deepest nesting of arrays and objects in ``raw`` (0 for a scalar), counted over
    brackets outside string literals. On a body that is not valid JSON the count is of its
    brackets as they stand (the parser refuses it afterwards). With ``stop_above``, the
    count stops within a chunk of passing it (a hostile body costs one chunk's sum)."""
    brackets = _STRING.sub(b'""', raw).translate(_STEP, _NOT_BRACKETS)
    deepest = depth = 0
    for start in range(0, len(brackets), _CHUNK):
        # Each opening bracket adds one level, each closing one removes one.
        levels = list(accumulate((b - 1 for b in brackets[start : start + _CHUNK]), initial=depth))
        deepest, depth = max(deepest, max(levels)), levels[-1]
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


def parse_object(raw: bytes, *, max_depth: int) -> dict[str, Any]:
    """``raw`` parsed as a JSON object nested at most ``max_depth`` levels deep."""
    depth = json_depth(raw, stop_above=max_depth)
    if depth > max_depth:
        raise BodyError(
            f"the body nests JSON at least {depth} levels deep; this server takes at most "
            f"{max_depth} ({DEPTH_KEY})"
        )
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BodyError(f"the body is not valid JSON: {error}") from None
    except RecursionError:  # unreachable below the interpreter's limit; never a 500
        raise BodyError(f"the body nests JSON too deep for the parser ({DEPTH_KEY})") from None
    if not isinstance(payload, dict):
        raise BodyError(f"the body must be a JSON object, got {type(payload).__name__}")
    return payload
