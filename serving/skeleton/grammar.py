"""The skeleton format: what the model may write before the branches are decoded.

A skeleton is one of two texts, with nothing before or after it (no trailing newline)::

    [DIRECT]

(the question needs no plan: answer it in one piece), or::

    [PLAN]
    1. <title>
    2. <title>
    ...
    [END]

with ``min_points``..``max_points`` points (default 2..6), numbered from 1 without gaps.
A title is 1..``max_title_chars`` characters (default 80, about twelve words) of printable
text on one line: no control character (``\\x00``-``\\x1f``, ``\\x7f``-``\\x9f``), no
``[`` (which would start a marker), not beginning or ending with a space. The length is
bounded in characters rather than words because a word count would multiply the states
of the automaton; 80 characters keep a six-point skeleton under about 150 tokens.

:meth:`SkeletonFormat.regex` is the one definition: the constrained decoder compiles it
(:mod:`serving.skeleton.constraint`) and the parser matches it with Python's ``re``
(:mod:`serving.skeleton.parse`). It uses only syntax that every regex engine here reads
the same way (literals, escapes, character classes, ``{m,n}``, ``?``, ``|``).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.errors import BadInputError

DIRECT_MARKER = "[DIRECT]"
PLAN_MARKER = "[PLAN]"
END_MARKER = "[END]"

MIN_POINTS = 2
MAX_POINTS = 6
MAX_TITLE_CHARS = 80

# A character a title may hold: printable (no C0/C1 control character, so no newline or
# tab) and not "[". ``_EDGE`` is the same without the space: a title neither starts nor
# ends with one.
_TITLE_CHAR = r"[^\x00-\x1f\x7f-\x9f\[]"
_EDGE_CHAR = r"[^\x00-\x20\x7f-\x9f\[]"


@dataclass(frozen=True)
class SkeletonFormat:
    """The bounds of a skeleton; the defaults are the module's constants."""

    min_points: int = MIN_POINTS
    max_points: int = MAX_POINTS
    max_title_chars: int = MAX_TITLE_CHARS

    def __post_init__(self) -> None:
        for name in ("min_points", "max_points", "max_title_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInputError(f"{name} must be a positive integer, got {value!r}")
        if self.min_points > self.max_points:
            raise BadInputError(
                f"min_points ({self.min_points}) must not exceed max_points ({self.max_points})"
            )

    def title_regex(self) -> str:
        """One title: an edge character, then optionally up to ``max_title_chars - 2``
        characters and another edge character."""
        if self.max_title_chars == 1:
            return _EDGE_CHAR
        return f"{_EDGE_CHAR}({_TITLE_CHAR}{{0,{self.max_title_chars - 2}}}{_EDGE_CHAR})?"

    def regex(self) -> str:
        """The whole skeleton, ``[DIRECT]`` or a plan. Points past ``min_points`` nest as
        optional groups so the numbers can only run 1, 2, 3, ... without gaps."""
        title = self.title_regex()
        required = "".join(f"{i}\\. {title}\\n" for i in range(1, self.min_points + 1))
        optional = ""
        for i in range(self.max_points, self.min_points, -1):
            optional = f"({i}\\. {title}\\n{optional})?"
        return f"{_escape(DIRECT_MARKER)}|{_escape(PLAN_MARKER)}\\n{required}{optional}" + _escape(
            END_MARKER
        )


def _escape(marker: str) -> str:
    return marker.replace("[", "\\[").replace("]", "\\]")


DEFAULT_FORMAT = SkeletonFormat()
