"""Reading a skeleton back: the text the constrained decoder wrote -> :class:`Skeleton`.

Strict: the text must match the grammar (:meth:`SkeletonFormat.regex`) exactly, with
nothing around it. Under the constraint that always holds; anything else is a bug worth
a clear error, not something to repair.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from serving.errors import BadInputError
from serving.skeleton.grammar import DEFAULT_FORMAT, DIRECT_MARKER, SkeletonFormat


@dataclass(frozen=True)
class Skeleton:
    """``direct``: answer in one piece (no points); otherwise the point titles, in order."""

    direct: bool
    points: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        """The skeleton as the model writes it (the inverse of :func:`parse_skeleton`)."""
        if self.direct:
            return DIRECT_MARKER
        lines = "".join(f"{i}. {title}\n" for i, title in enumerate(self.points, start=1))
        return f"[PLAN]\n{lines}[END]"


@functools.lru_cache(maxsize=16)
def _compiled(fmt: SkeletonFormat) -> re.Pattern[str]:
    return re.compile(fmt.regex())


_POINT = re.compile(r"(\d+)\. (.*)")


def parse_skeleton(text: str, fmt: SkeletonFormat = DEFAULT_FORMAT) -> Skeleton:
    """The skeleton ``text`` holds; :class:`BadInputError` if it is not exactly one."""
    if not isinstance(text, str):
        raise BadInputError(f"a skeleton is text, got {type(text).__name__}")
    if not _compiled(fmt).fullmatch(text):
        raise BadInputError(
            f"not a skeleton: {text[:200]!r}; expected {DIRECT_MARKER!r} or '[PLAN]' and "
            f"{fmt.min_points}-{fmt.max_points} numbered points of 1-{fmt.max_title_chars} "
            "characters, one per line, then '[END]' (see serving/skeleton/grammar.py)"
        )
    if text == DIRECT_MARKER:
        return Skeleton(direct=True)
    points = []
    for line in text.split("\n")[1:-1]:  # between "[PLAN]" and "[END]"
        match = _POINT.fullmatch(line)
        assert match is not None, line  # the grammar guarantees "N. title" lines
        points.append(match.group(2))
    return Skeleton(direct=False, points=points)
