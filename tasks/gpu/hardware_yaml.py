"""Write a measured curve into ``configs/hardware.yaml`` under one target, keeping every
other line (and comment) of the file as it is.

The key's old value and the comment block right above it (its provenance) are replaced by
the new value and the given comment; the result is parsed back and must hold exactly the
new value, or nothing is written.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import yaml

from serving.atomic import atomic_path
from serving.errors import BadInputError

WIDTH = 92
TARGET_INDENT = 2
KEY_INDENT = 4


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def flow_list(key: str, values: list, indent: int = KEY_INDENT) -> list[str]:
    """``key: [a, b, ...]`` wrapped under ``WIDTH`` columns, continuation lines aligned."""
    head = " " * indent + f"{key}: ["
    body = ", ".join(_scalar(v) for v in values) + "]"
    wrapped = textwrap.wrap(
        body, width=WIDTH - len(head), break_long_words=False, break_on_hyphens=False
    )
    return [head + wrapped[0]] + [" " * len(head) + line for line in wrapped[1:]]


def _scalar(value) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    return str(round(float(value), 4)) if isinstance(value, float) else str(value)


def set_target_key(
    path: str | Path, target: str, key: str, values: list, comment: list[str]
) -> None:
    """Set ``targets.<target>.<key>`` to ``values`` in the YAML file ``path``."""
    path = Path(path)
    lines = path.read_text().splitlines()
    header = re.compile(rf"  {re.escape(target)}:\s*(#.*)?")
    start = next((i for i, line in enumerate(lines) if header.fullmatch(line)), None)
    if start is None:
        raise BadInputError(f"{path} has no target {target!r} under targets:")
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if lines[i].strip() and _indent(lines[i]) <= TARGET_INDENT
        ),
        len(lines),
    )
    key_at = next(
        (
            i
            for i in range(start + 1, end)
            if _indent(lines[i]) == KEY_INDENT and lines[i].lstrip().startswith(f"{key}:")
        ),
        None,
    )
    new = [" " * KEY_INDENT + f"# {line}" if line else " " * KEY_INDENT + "#" for line in comment]
    new += flow_list(key, values)
    if key_at is None:
        insert_at = next(
            (
                i
                for i in range(start + 1, end)
                if lines[i].lstrip().startswith("runs_here:") and _indent(lines[i]) == KEY_INDENT
            ),
            end,
        )
        lines[insert_at:insert_at] = new
    else:
        after = key_at + 1
        while after < end and lines[after].strip() and _indent(lines[after]) > KEY_INDENT:
            after += 1
        before = key_at
        while (
            before > start + 1
            and lines[before - 1].lstrip().startswith("#")
            and (_indent(lines[before - 1]) == KEY_INDENT)
        ):
            before -= 1
        lines[before:after] = new
    text = "\n".join(lines) + "\n"
    written = (yaml.safe_load(text) or {}).get("targets", {}).get(target, {}).get(key)
    expected = yaml.safe_load("[" + ", ".join(_scalar(v) for v in values) + "]")
    if written != expected:
        raise BadInputError(f"writing {key} under {target} in {path} did not round-trip")
    with atomic_path(path) as scratch:
        Path(scratch).write_text(text)
